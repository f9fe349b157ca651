// Names of functions and programs, as messages and MLflow runs show them: a function's
// name is found for static and anonymous-namespace functions too (the binary's own symbol
// table), and a run's name is the plain one, never a signature.
#include "rank/program.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

int in_anonymous_namespace(int x) { return x + 1; }

}  // namespace

static int file_static(int x) { return x * 2; }

namespace outer {
int in_namespace(std::string s) { return static_cast<int>(s.size()); }
}  // namespace outer

using sgpu::rank::code_name;
using sgpu::rank::plain_name;
using sgpu::rank::program_run_name;

TEST(CodeName, FindsFunctionsTheDynamicSymbolsLack) {
  EXPECT_EQ(code_name(reinterpret_cast<const void*>(&in_anonymous_namespace)),
            "(anonymous namespace)::in_anonymous_namespace(int)");
  EXPECT_EQ(code_name(reinterpret_cast<const void*>(&file_static)), "file_static(int)");
  EXPECT_EQ(code_name(reinterpret_cast<const void*>(&outer::in_namespace)),
            "outer::in_namespace(std::__cxx11::basic_string<char, std::char_traits<char>, "
            "std::allocator<char> >)");
}

TEST(PlainName, IsTheFunctionsOwnNameWithoutScopeParametersOrTemplates) {
  EXPECT_EQ(plain_name("hello_world(std::string)"), "hello_world");
  EXPECT_EQ(plain_name("(anonymous namespace)::train_mlp((anonymous namespace)::Job)"),
            "train_mlp");
  EXPECT_EQ(plain_name("outer::inner::step(int, double)"), "step");
  EXPECT_EQ(plain_name("int outer::step<std::vector<int, std::allocator<int> > >(int)"), "step");
  EXPECT_EQ(plain_name("(anonymous namespace)::Timing (anonymous namespace)::time_it<3>(int)"),
            "time_it");
  EXPECT_EQ(plain_name(code_name(reinterpret_cast<const void*>(&outer::in_namespace))),
            "in_namespace");
  EXPECT_EQ(plain_name("main::{lambda(int)#1}::_FUN(int)"), "main lambda");
  EXPECT_EQ(plain_name("{lambda(int)#2}::_FUN(int)"), "lambda");
  EXPECT_EQ(plain_name("(anonymous namespace)::train()::$_0::__invoke(int)"), "train lambda");
  int (*lambda)(int) = [](int x) { return x; };
  EXPECT_EQ(plain_name(code_name(reinterpret_cast<const void*>(lambda))), "TestBody lambda");
}

TEST(ProgramRunName, IsTheProgramOrTheInterpretersScript) {
  using Command = std::vector<std::string>;
  EXPECT_EQ(program_run_name(Command{"python", "train.py", "--epochs", "3"}), "train.py");
  EXPECT_EQ(program_run_name(Command{"/opt/venv/bin/python3.11", "-u", "/src/train.py"}),
            "train.py");
  EXPECT_EQ(program_run_name(Command{"python3", "-m", "torch.distributed.run", "x.py"}),
            "torch.distributed.run");
  EXPECT_EQ(program_run_name(Command{"python3", "-c", "print(1)"}), "python3");
  EXPECT_EQ(program_run_name(Command{"bash", "job.sh"}), "job.sh");
  EXPECT_EQ(program_run_name(Command{"./build/bin/my_benchmark", "--fast"}), "my_benchmark");
  EXPECT_EQ(program_run_name(Command{"pythonic_tool", "arg"}), "pythonic_tool");
}
