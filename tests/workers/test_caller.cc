// A caller that its test kills: it launches `ranks` ranks that each leave a grandchild
// behind, print "ready" and hang; the test then signals this process. With
// "ignore-sigterm", the caller ignores SIGTERM and its ranks return 3 s after "ready".
//   test_caller <ranks> [ignore-sigterm]
#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "sgpu/sgpu.h"
#include "testing/sim_options.h"

int hang(int seconds) {
  if (std::system("sleep 300 &") != 0) return -1;
  std::cout << "ready" << std::endl;
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  return 0;
}

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  sgpu::Options options = sgpu::testing::sim(argc > 1 ? std::atoi(argv[1]) : 2);
  options.teardown_grace = std::chrono::seconds(2);
  const bool ignore_sigterm = argc > 2 && std::string(argv[2]) == "ignore-sigterm";
  if (ignore_sigterm) ::signal(SIGTERM, SIG_IGN);
  try {
    sgpu::distributed(hang, options).distributed(ignore_sigterm ? 3 : 300);
    std::cout << "the call returned" << std::endl;
  } catch (const sgpu::Error& e) {
    std::cout << "caller caught: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
