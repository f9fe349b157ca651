// The routes of a group over a device transport and a host one (collectives/routes.h):
// each operation runs on its tensors' side, a barrier on the host's unless it names a
// device, as torch's "cpu:gloo,cuda:nccl" does. Meta tensors stand for device ones here.
#include "collectives/routes.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

// A backend that notes the operations it is given and completes them at once.
class Noting final : public c10d::Backend {
 public:
  explicit Noting(std::string name) : c10d::Backend(0, 2), name_(std::move(name)) {}
  const std::string getBackendName() const override { return name_; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& /*tensors*/,
                                           const c10d::AllreduceOptions& /*opts*/) override {
    return noted("allreduce");
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& /*output*/, at::Tensor& /*input*/,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    return noted("allgather");
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& /*tensors*/, int /*dst*/,
                                      int /*tag*/) override {
    return noted("send");
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    return noted("barrier");
  }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  std::vector<std::string> ops;
  std::chrono::milliseconds timeout_{0};

 private:
  c10::intrusive_ptr<c10d::Work> noted(std::string op) {
    ops.push_back(std::move(op));
    auto done = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
    done->markCompleted(c10::IValue());
    return c10d::Work::create_from_future(done);
  }
  std::string name_;
};

struct Routed {
  c10::intrusive_ptr<Noting> device = c10::make_intrusive<Noting>("nccl");
  c10::intrusive_ptr<Noting> host = c10::make_intrusive<Noting>("gloo");
  c10::intrusive_ptr<c10d::Backend> group = sgpu::collectives::routed_by_device(device, host);
};

using Ops = std::vector<std::string>;

TEST(Routes, EachOperationRunsOnItsTensorsSide) {
  Routed r;
  std::vector<at::Tensor> on_host{at::ones({4})};
  std::vector<at::Tensor> on_device{at::ones({4}, at::Device(at::kMeta))};
  r.group->allreduce(on_host)->wait();
  r.group->allreduce(on_device)->wait();
  at::Tensor out = at::empty({8}, at::Device(at::kMeta));
  r.group->_allgather_base(out, on_device[0])->wait();
  r.group->send(on_host, 1, 0)->wait();
  EXPECT_EQ(r.host->ops, (Ops{"allreduce", "send"}));
  EXPECT_EQ(r.device->ops, (Ops{"allreduce", "allgather"}));
}

TEST(Routes, ABarrierIsTheHostsUnlessItNamesADevice) {
  Routed r;
  r.group->barrier()->wait();  // dist.barrier() on a group with a CPU backend
  c10d::BarrierOptions cpu;
  cpu.device = at::Device(at::kCPU);
  r.group->barrier(cpu)->wait();
  c10d::BarrierOptions ids;  // dist.barrier(device_ids=[0]) as it reaches the backend
  ids.device_ids = {0};
  r.group->barrier(ids)->wait();
  c10d::BarrierOptions device;
  device.device = at::Device(at::kMeta);
  r.group->barrier(device)->wait();
  EXPECT_EQ(r.host->ops, (Ops{"barrier", "barrier"}));
  EXPECT_EQ(r.device->ops, (Ops{"barrier", "barrier"}));
}

TEST(Routes, TheGroupIsNamedAfterItsDeviceSideAndATimeoutReachesBoth) {
  Routed r;
  EXPECT_EQ(r.group->getBackendName(), "nccl");
  r.group->setTimeout(std::chrono::seconds(7));
  EXPECT_EQ(r.device->timeout_, std::chrono::seconds(7));
  EXPECT_EQ(r.host->timeout_, std::chrono::seconds(7));
}

}  // namespace
