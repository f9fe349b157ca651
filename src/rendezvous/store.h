// The rendezvous store ranks meet at: a c10d TCPStore hosted by the caller.
//
// It listens on loopback (unless told otherwise) on a port the operating system assigns
// and the caller holds for the whole call, so rank 0 exiting first cannot take it down and
// two calls running at once never collide. Ranks reach it through MASTER_ADDR/MASTER_PORT.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace sgpu::rendezvous {

class HostStore {
 public:
  // Starts listening. Throws std::runtime_error when the store cannot start.
  explicit HostStore(std::string host = "127.0.0.1");
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

}  // namespace sgpu::rendezvous
