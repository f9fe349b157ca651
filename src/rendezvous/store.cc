#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <c10/util/Logging.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "rendezvous/peer_names.h"

namespace sgpu::rendezvous {

namespace {

[[noreturn]] void fail(const std::string& host, const std::string& what) {
  throw std::runtime_error("sgpu: cannot start the rendezvous store on " + host + ": " + what);
}

// A listening TCP socket bound to `address` on `port` (0: the kernel picks, and `port`
// says which). c10d's TCPStore binds the wildcard address itself; handed a socket, it
// listens only where that socket does. -1 with `error` set when it cannot bind.
int bind_listen(const sockaddr* address, socklen_t length, std::uint16_t& port, int& error) {
  sockaddr_storage bound{};
  std::memcpy(&bound, address, length);
  auto* v4 = reinterpret_cast<sockaddr_in*>(&bound);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&bound);
  (bound.ss_family == AF_INET ? v4->sin_port : v6->sin6_port) = htons(port);
  const int fd = ::socket(bound.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = errno;
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&bound), length) != 0 ||
      ::listen(fd, SOMAXCONN) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    error = errno;
    ::close(fd);
    return -1;
  }
  port = ntohs(bound.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
  return fd;
}

std::string numeric(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = "?";
  const void* raw =
      address->sa_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(address)->sin_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
  ::inet_ntop(address->sa_family, raw, text, sizeof text);
  return text;
}

// `host` is a numeric address, or a name: its addresses are tried in turn, and one of
// them must be this node's.
int listen_on(const std::string& host, std::uint16_t& port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    fail(host, std::string("cannot resolve it: ") + ::gai_strerror(rc));
  }
  std::string tried;
  int error = 0;
  for (const addrinfo* at = found; at != nullptr; at = at->ai_next) {
    if (at->ai_family != AF_INET && at->ai_family != AF_INET6) continue;
    std::uint16_t chosen = port;
    const int fd = bind_listen(at->ai_addr, at->ai_addrlen, chosen, error);
    if (fd >= 0) {
      ::freeaddrinfo(found);
      port = chosen;
      return fd;
    }
    tried += (tried.empty() ? "" : ", ") + numeric(at->ai_addr);
  }
  ::freeaddrinfo(found);
  if (error == EADDRNOTAVAIL) {
    fail(host, "it is " + tried +
                   ", not an address of this node: the node that hosts the store must be the "
                   "host its endpoint names");
  }
  fail(host + (tried == host ? "" : " (" + tried + ")") +
           (port != 0 ? " port " + std::to_string(port) : ""),
       std::strerror(error));
}

}  // namespace

struct HostStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

HostStore::HostStore(std::string host, std::uint16_t port)
    : impl_(std::make_unique<Impl>()), host_(std::move(host)), port_(port) {
  name_mapped_peers_as_ipv4();  // NOTE [Store peers' names]
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

struct StoreClient::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::string endpoint;
};

StoreClient::StoreClient(const std::string& host, std::uint16_t port,
                         std::chrono::milliseconds wait, std::chrono::milliseconds op_timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->endpoint = host + ":" + std::to_string(port);
  name_mapped_peers_as_ipv4();  // NOTE [Store peers' names]
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = wait;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(host, options);
    impl_->store->setTimeout(op_timeout);
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot reach the store at " + impl_->endpoint + ": " +
                             e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot reach the store at " + impl_->endpoint + ": " + e.what());
  }
}

StoreClient::~StoreClient() = default;

namespace {

template <typename F>
auto guarded(const std::string& endpoint, F&& f) {
  try {
    return f();
  } catch (const c10::Error& e) {  // c10's text without its C++ frames
    throw std::runtime_error("the store at " + endpoint +
                             " is gone: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error("the store at " + endpoint + " is gone: " + e.what());
  }
}

std::vector<std::uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string text(const std::vector<std::uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace

void StoreClient::set(const std::string& key, const std::string& value) {
  guarded(impl_->endpoint, [&] {
    impl_->store->set(key, bytes(value));
    return 0;
  });
}

std::optional<std::string> StoreClient::get(const std::string& key) {
  return guarded(impl_->endpoint, [&]() -> std::optional<std::string> {
    if (!impl_->store->check({key})) return std::nullopt;
    return text(impl_->store->get(key));
  });
}

std::int64_t StoreClient::add(const std::string& key, std::int64_t delta) {
  return guarded(impl_->endpoint, [&] { return impl_->store->add(key, delta); });
}

std::string StoreClient::set_if_absent(const std::string& key, const std::string& value) {
  return guarded(impl_->endpoint,
                 [&] { return text(impl_->store->compareSet(key, {}, bytes(value))); });
}

void quiet_c10_warnings() {
  if (std::getenv("TORCH_CPP_LOG_LEVEL") != nullptr) return;
  FLAGS_caffe2_log_level = std::max<int>(FLAGS_caffe2_log_level, 2);  // c10's ERROR
}

}  // namespace sgpu::rendezvous
