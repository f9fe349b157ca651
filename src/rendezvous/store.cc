#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace sgpu::rendezvous {

namespace {

[[noreturn]] void fail(const std::string& host, const std::string& what) {
  throw std::runtime_error("sgpu: cannot start the rendezvous store on " + host + ": " + what);
}

// A listening TCP socket bound to `host` (a numeric IPv4 or IPv6 address) on a port the
// kernel picks. c10d's TCPStore binds the wildcard address itself; handed a socket, it
// listens only where that socket does.
int listen_on(const std::string& host, std::uint16_t& port) {
  sockaddr_storage address{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    length = sizeof *v4;
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    length = sizeof *v6;
  } else {
    fail(host, "not a numeric IP address");
  }
  const int fd = ::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(host, std::string("socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      ::listen(fd, SOMAXCONN) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    ::close(fd);
    fail(host, std::strerror(error));
  }
  port = ntohs(address.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
  return fd;
}

}  // namespace

struct HostStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

HostStore::HostStore(std::string host) : impl_(std::make_unique<Impl>()), host_(std::move(host)) {
  c10d::TCPStoreOptions options;
  options.masterListenFd = listen_on(host_, port_);  // the store owns it from here on
  options.port = port_;
  options.isServer = true;
  options.waitWorkers = false;
  options.numWorkers = std::nullopt;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(host_, options);
  } catch (const std::exception& e) {
    fail(host_, e.what());
  }
}

HostStore::~HostStore() = default;

}  // namespace sgpu::rendezvous
