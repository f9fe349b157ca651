#include "rendezvous/store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace sgpu::rendezvous {

struct HostStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

HostStore::HostStore(std::string host) : impl_(std::make_unique<Impl>()), host_(std::move(host)) {
  c10d::TCPStoreOptions options;
  options.port = 0;  // the OS picks a free port; the store reports it
  options.isServer = true;
  options.waitWorkers = false;
  options.numWorkers = std::nullopt;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(host_, options);
  } catch (const std::exception& e) {
    throw std::runtime_error("sgpu: cannot start the rendezvous store on " + host_ + ": " +
                             e.what());
  }
  port_ = impl_->store->getPort();
}

HostStore::~HostStore() = default;

}  // namespace sgpu::rendezvous
