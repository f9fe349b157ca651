#include "collectives/routes.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "collectives/interposer.h"

namespace sgpu::collectives {
namespace {

class RoutedBackend final : public InterposingBackend {
 public:
  RoutedBackend(c10::intrusive_ptr<c10d::Backend> device, c10::intrusive_ptr<c10d::Backend> host)
      : InterposingBackend(std::move(device)), host_(std::move(host)) {}

  void setTimeout(std::chrono::milliseconds timeout) override {
    inner().setTimeout(timeout);
    host_->setTimeout(timeout);
  }

 protected:
  c10::intrusive_ptr<c10d::Work> around(const OpCall& /*call*/, Run run) override { return run(); }
  c10d::Backend& target(const OpCall& call) override { return call.host ? *host_ : inner(); }

 private:
  c10::intrusive_ptr<c10d::Backend> host_;
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> routed_by_device(c10::intrusive_ptr<c10d::Backend> device,
                                                   c10::intrusive_ptr<c10d::Backend> host) {
  return c10::make_intrusive<RoutedBackend>(std::move(device), std::move(host));
}

c10::intrusive_ptr<c10d::Backend> gloo_group(c10::intrusive_ptr<c10d::Store> store, int rank,
                                             int world_size, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = timeout;
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(std::move(store), rank, world_size, options);
}

}  // namespace sgpu::collectives
