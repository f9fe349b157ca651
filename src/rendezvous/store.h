// The rendezvous store ranks meet at: a c10d TCPStore hosted by the caller.
//
// It listens on loopback (unless told otherwise) on a port the operating system assigns
// and the caller holds for the whole call, so rank 0 exiting first cannot take it down and
// two calls running at once never collide. Ranks reach it through MASTER_ADDR/MASTER_PORT.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace sgpu::rendezvous {

// c10's warnings off in this process, its errors kept, unless TORCH_CPP_LOG_LEVEL says
// otherwise: for a process that reports a lost store itself (c10d's own warning for it
// comes with C++ frames).
void quiet_c10_warnings();

class HostStore {
 public:
  // Starts listening on `host` (an address, or a name that resolves to one of this node's
  // addresses) and `port` (0: one the kernel picks). Throws std::runtime_error when the
  // store cannot start, naming the address.
  explicit HostStore(std::string host = "127.0.0.1", std::uint16_t port = 0);
  ~HostStore();
  HostStore(const HostStore&) = delete;
  HostStore& operator=(const HostStore&) = delete;

  const std::string& host() const { return host_; }
  std::uint16_t port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  std::uint16_t port_ = 0;
};

// A client of a store, for the launcher's own keys (nodes/node_link.h). Every
// operation throws std::runtime_error when the store is gone.
class StoreClient {
 public:
  // Connects to HOST:PORT, trying again until `wait` has passed; each operation after
  // gives up after `op_timeout`. Throws std::runtime_error naming the endpoint.
  StoreClient(const std::string& host, std::uint16_t port, std::chrono::milliseconds wait,
              std::chrono::milliseconds op_timeout = std::chrono::seconds(5));
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  // The key's value, or nullopt when it is not set.
  std::optional<std::string> get(const std::string& key);
  std::int64_t add(const std::string& key, std::int64_t delta);
  // Sets `key` to `value` unless it is set already; returns what it holds afterwards.
  std::string set_if_absent(const std::string& key, const std::string& value);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sgpu::rendezvous
