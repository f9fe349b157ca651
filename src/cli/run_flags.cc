#include "cli/run_flags.h"

#include <cctype>
#include <iostream>
#include <stdexcept>

#include "contract/option_table.h"

namespace sgpu::cli {
namespace {

using contract::OptionRow;
using contract::OptionType;

constexpr const char* kNprocPerNode = "--nproc-per-node";

// A row's Markdown as the command's help shows it: "[text](link)" is text, code is plain.
std::string plain(std::string_view markdown) {
  std::string text;
  for (std::size_t i = 0; i < markdown.size(); ++i) {
    const char c = markdown[i];
    if (c == '`') continue;
    if (c == '\\' && i + 1 < markdown.size()) {
      text += markdown[++i];
      continue;
    }
    if (c == '[') {  // a link: its text, without the target
      const std::size_t close = markdown.find("](", i);
      const std::size_t end = close == std::string_view::npos ? close : markdown.find(')', close);
      if (end != std::string_view::npos) {
        text += markdown.substr(i + 1, close - i - 1);
        i = end;
        continue;
      }
    }
    text += c;
  }
  return text;
}

// The flag's help: the row's doc ("--no-..." flags say what they leave out) and default.
std::string help_of(const OptionRow& row) {
  std::string help = plain(row.doc);
  if (row.flag.rfind("--no-", 0) == 0) return "Do not " + help;
  if (!help.empty()) help[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(help[0])));
  return help + " (default: " + plain(row.shown_default) + ")";
}

void add_option_flags(CLI::App& run, RunFlags& flags) {
  for (const OptionRow& row : contract::option_table()) {
    if (row.flag.empty()) continue;
    const std::string name(row.name);
    if (row.type == OptionType::kBool) {
      run.add_flag(std::string(row.flag), flags.switches[name], help_of(row));
    } else {
      run.add_option(std::string(row.flag), flags.values[name], help_of(row))
          ->type_name(contract::type_text(row.type).metavar);
    }
  }
  // torchrun's name for --gpus, so that its command lines run as they are.
  run.add_option(kNprocPerNode, flags.values["gpus"], "The same as --gpus (torchrun's name)")
      ->type_name("INT")
      ->excludes(run.get_option("--gpus"));
  // What only the command refuses: it leaves "detected" to leaving the flag out.
  run.get_option("--nnodes")->check(CLI::PositiveNumber);
  run.get_option("--node-rank")->check(CLI::NonNegativeNumber);
}

}  // namespace

void add_run_command(CLI::App& app, RunFlags& flags) {
  CLI::App* run = flags.command_line = app.add_subcommand(
      "run", "Start PROGRAM on N ranks with torchrun's environment (RANK, WORLD_SIZE, ...)");
  run->footer(
      "Exit status: 0 when every rank succeeded; the root-cause rank's exit code, or\n"
      "128+signal; 124 on timeout or hang; 3 when the node cannot serve the request; 2 for bad\n"
      "flags or options (a tracking URI that cannot work, say).\n"
      "Standard input: every rank reads /dev/null (not sgpu's own standard input); give a\n"
      "rank its input in a file or in its arguments.\n"
      "Example:\n"
      "  sgpu run --gpus 4 --backend sim --ranks 0 -- python -c 'import os; "
      "print(os.environ[\"RANK\"])'\n"
      "  srun -N2 --ntasks-per-node=1 sgpu run --gpus 8 -- python train.py   (two nodes)\n"
      "  sgpu run --nnodes 2 --node-rank 0 --rdzv-endpoint n1:29500 --gpus 8 -- python train.py\n"
      "  sgpu run --backend sim --nnodes 4 --nproc-per-node 8 -- python train.py   (4 simulated\n"
      "      nodes, all on this machine: no --node-rank or --rdzv-endpoint)\n"
      "  sgpu run --gpus 8 --backend sim --sim-compute shapes -- python "
      "examples/models/llama_step.py");
  add_option_flags(*run, flags);
  run->add_option("command", flags.command, "PROGRAM ARGS... (after --)")->required();
}

Options command_options() {
  Options options;
  options.front_end = FrontEnd::kCommand;
  return options;
}

std::optional<Options> options_of(const RunFlags& flags) {
  Options options = command_options();
  for (const OptionRow& row : contract::option_table()) {
    if (row.flag.empty()) continue;
    const std::string name(row.name);
    if (row.type == OptionType::kBool) {
      // "--keep-run-dir" sets its option, "--no-tracking" clears it.
      if (flags.switches.at(name)) row.set(options, row.flag.rfind("--no-", 0) != 0);
      continue;
    }
    // --gpus given under torchrun's name
    const bool alias = name == "gpus" && flags.command_line->count(kNprocPerNode) > 0;
    if (!alias && flags.command_line->count(std::string(row.flag)) == 0) continue;
    const std::string& text = flags.values.at(name);
    try {
      row.set(options, contract::option_value_of_text(row, text));
    } catch (const std::exception&) {  // no value of its kind, NaN seconds among them
      std::cerr << "sgpu run: " << (alias ? kNprocPerNode : row.flag) << " takes "
                << contract::type_text(row.type).takes << ", got \"" << text << "\"\n";
      return std::nullopt;
    }
  }
  return options;
}

}  // namespace sgpu::cli
