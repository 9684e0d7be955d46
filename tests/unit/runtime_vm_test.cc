// The VM and the static memory planner, on hand-built programs (host kernels
// only, so no code generation is involved).
#include <gtest/gtest.h>

#include "runtime/memory_plan.h"
#include "runtime/vm.h"

namespace kiln::runtime {
namespace {

TEST(MemoryPlan, OverlappingLifetimesDoNotShareBytes) {
  std::vector<BufferLifetime> bufs = {{100, 0, 2}, {64, 1, 3}, {200, 3, 4}, {10, 4, 5}};
  MemoryPlan plan = plan_memory(bufs);
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_EQ(plan.offsets[i] % 64, 0);
    for (size_t j = i + 1; j < bufs.size(); ++j) {
      bool live_together = bufs[i].first <= bufs[j].last && bufs[j].first <= bufs[i].last;
      bool bytes_overlap = plan.offsets[i] < plan.offsets[j] + bufs[j].bytes &&
                           plan.offsets[j] < plan.offsets[i] + bufs[i].bytes;
      EXPECT_FALSE(live_together && bytes_overlap) << i << " and " << j;
    }
  }
  // Buffer 0 dies before buffer 2 is born: the arena is smaller than the sum.
  EXPECT_LT(plan.arena_bytes, 128 + 64 + 256 + 64);
}

TEST(MemoryPlan, DisjointLifetimesReuseTheSameBytes) {
  MemoryPlan plan = plan_memory({{4096, 0, 1}, {4096, 2, 3}, {4096, 4, 5}});
  EXPECT_EQ(plan.arena_bytes, 4096);
}

// reg0 (input f32[n]) -> host "add one" -> reg1 -> view as [1, n] -> reg2 (output)
std::shared_ptr<Program> add_one_program() {
  auto p = std::make_shared<Program>();
  p->registers.resize(4);
  p->registers[0] = {"x", DType::kFloat32, {var("n")}};
  p->registers[1] = {"y", DType::kFloat32, {var("n")}};
  p->registers[2] = {"z", DType::kFloat32, {1, var("n")}};
  p->registers[3] = {"shape", DType::kInt64, {2}};
  p->registers[3].is_output = true;
  p->registers[2].is_output = true;
  p->host_kernels.push_back([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    out[0] = Tensor(DType::kFloat32, in[0].shape());
    for (int64_t i = 0; i < in[0].numel(); ++i) out[0].data_as<float>()[i] = in[0].data_as<float>()[i] + 1;
    return Status::ok();
  });
  Instr call;
  call.op = OpCode::kCallHost;
  call.callee = 0;
  call.inputs = {0};
  call.outputs = {1};
  Instr view;
  view.op = OpCode::kView;
  view.inputs = {1};
  view.outputs = {2};
  Instr shape;
  shape.op = OpCode::kShapeOf;
  shape.outputs = {3};
  shape.values = {1, var("n") * 2};
  p->instrs = {call, view, shape};
  p->input_registers = {0};
  p->output_registers = {2, 3};
  p->bounds["n"] = Interval{1, std::nullopt};
  return p;
}

TEST(VM, RunsHostKernelViewAndShapeOf) {
  VM vm(add_one_program(), 1);
  Tensor x(DType::kFloat32, {5});
  for (int i = 0; i < 5; ++i) x.data_as<float>()[i] = static_cast<float>(i);
  auto out = vm.run({x});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].shape(), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ((*out)[0].data_as<float>()[4], 5.0f);
  EXPECT_EQ((*out)[1].data_as<int64_t>()[0], 1);
  EXPECT_EQ((*out)[1].data_as<int64_t>()[1], 10);
}

TEST(VM, RejectsWrongDtypeRankAndBounds) {
  VM vm(add_one_program(), 1);
  auto bad_dtype = vm.run({Tensor(DType::kInt32, {5})});
  ASSERT_FALSE(bad_dtype.is_ok());
  EXPECT_NE(bad_dtype.status().message().find("input 'x' has dtype i32, expected f32"), std::string::npos)
      << bad_dtype.status().message();
  auto bad_rank = vm.run({Tensor(DType::kFloat32, {5, 2})});
  ASSERT_FALSE(bad_rank.is_ok());
  EXPECT_NE(bad_rank.status().message().find("rank 2"), std::string::npos) << bad_rank.status().message();
  auto below_bound = vm.run({Tensor(DType::kFloat32, {0})});
  ASSERT_FALSE(below_bound.is_ok());
  EXPECT_NE(below_bound.status().message().find("outside its bounds"), std::string::npos);
  EXPECT_FALSE(vm.run({}).is_ok());
}

TEST(VM, BranchAndJumpFormALoop) {
  // r0: i64 counter (host kernel decrements and sets r1 = counter > 0); loop until false.
  auto p = std::make_shared<Program>();
  p->registers.resize(2);
  p->registers[0] = {"c", DType::kInt64, {}};
  p->registers[1] = {"more", DType::kBool, {}};
  p->registers[0].is_output = true;
  int calls = 0;
  p->host_kernels.push_back([&calls](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    ++calls;
    out[0] = Tensor(DType::kInt64, {});
    out[0].data_as<int64_t>()[0] = in[0].data_as<int64_t>()[0] - 1;
    out[1] = Tensor(DType::kBool, {});
    out[1].data_as<uint8_t>()[0] = out[0].data_as<int64_t>()[0] > 0;
    return Status::ok();
  });
  Instr dec;
  dec.op = OpCode::kCallHost;
  dec.callee = 0;
  dec.inputs = {0};
  dec.outputs = {0, 1};
  Instr br;
  br.op = OpCode::kBranch;
  br.inputs = {1};
  br.target = 3;
  Instr jump;
  jump.op = OpCode::kJump;
  jump.target = 0;
  Instr ret;
  ret.op = OpCode::kRet;
  p->instrs = {dec, br, jump, ret};
  p->input_registers = {0};
  p->output_registers = {0};
  VM vm(p, 1);
  Tensor c(DType::kInt64, {});
  c.data_as<int64_t>()[0] = 4;
  auto out = vm.run({c});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(calls, 4);
  EXPECT_EQ((*out)[0].data_as<int64_t>()[0], 0);
}

}  // namespace
}  // namespace kiln::runtime
