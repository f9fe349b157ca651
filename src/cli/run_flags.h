// `sgpu run`'s flags: one for each row of the option table that has one (NOTE [The option
// table]), their help from the row, and the call's options from what was given.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sgpu/options.h"

namespace sgpu::cli {

struct RunFlags {
  CLI::App* command_line = nullptr;
  std::map<std::string, std::string> values;  // a row's name: its flag's text, as given
  std::map<std::string, bool> switches;       // a true-or-false row's name: its flag given
  std::vector<std::string> command;           // the program and its arguments
};

// The `run` subcommand of `app`, its flags bound to `flags`.
void add_run_command(CLI::App& app, RunFlags& flags);

// The call's options from the flags given; nullopt (said on stderr) for a flag whose text
// is no value of its kind. The options' own checks come later, with the call.
std::optional<Options> options_of(const RunFlags& flags);

// Options whose errors name settings as this command's flags (NOTE [Front ends]): every
// Options the command makes starts here.
Options command_options();

}  // namespace sgpu::cli
