# Writes tests/ir/block_layout.kir (its constants are random): .venv/bin/python tests/ir/gen_block_layout.py > tests/ir/block_layout.kir
import random
random.seed(7)
def const(name, shape, lo=-0.5, hi=0.5):
    n=1
    for d in shape: n*=d
    vals=", ".join("%.2f" % random.uniform(lo,hi) for _ in range(n))
    return f'  %{name}: f32[{", ".join(map(str,shape))}] = const<f32[{",".join(map(str,shape))}] [{vals}]>\n'
hdr='''// block-layout: convolution chains on blocked channels (NCHW16c on a
// 16-lane target; the target's lanes otherwise). The stem reads its 3-channel
// NCHW input directly (in_blocked = 0); the depthwise convolution, its Clip,
// the 1x1 projection to 24 channels (padded to 32: weights zero past 24), a
// BatchNormalization (per-channel Mul and Add), a Div by a per-channel
// constant (padded with ones), the residual Add, a Pad of the plane (no pad
// on the lanes), MaxPool and AveragePool (window [3, 3, 1]),
// a channel Concat and Split of whole blocks and GlobalAveragePool (ReduceMean
// over the plane) all stay blocked; the graph output %o reads the chain
// through one FromBlocked, and %q through another. A Transpose of blocked
// data to channels-last is one FromBlocked with channels_last (%t, %tl);
// data transposed back from channels-last (%tb) is converted by a
// ToBlocked reading the channels-last tensor when an op on it (%ls, a
// per-channel Mul) feeds a blocked chain (the residual Add %res), as in
// convnext's blocks, or a convolution reads it (%tb2 into %tc: in_blocked = 1, as
// convnext's downsampling after its channels-last LayerNorm). A 1x5 convolution with one group stays NCHW (a
// chain edge: FromBlocked before it); so does a 3x3 stride-1 one the strategy
// gives Winograd (larger planes and channels than fit here; resnet18's model
// test covers it). A weight two convolutions share is re-laid out once.
// --check-equiv runs the graph before and after the pass on the same random
// inputs.
// RUN: kiln opt %s --block-layout | FileCheck %s
// RUN: kiln opt %s --check-equiv=block-layout | FileCheck %s --check-prefix=EQUIV
// RUN: kiln opt %s --block-layout --select-kernels --lower | FileCheck %s --check-prefix=LOWER
// EQUIV: with vs without block-layout
// EQUIV-NOT: DIFFERENT
// The stem's Relu and the depthwise convolution's Clip are computed in the
// blocked template's write-back (fuse_epilogue), like the NCHW templates'
// (the stem's weights outweigh its input, so threads split its output
// blocks: rows=0).
// LOWER: implementation conv.blocked (epi=0 mr=8 nb=2 rows=0) by priority
// LOWER-NEXT: kernel Relu(p0:f32[1, 3, 16, 16], p1:f32[2, 3, 3, 3, 16], p2:f32[2, 16], -> p3:f32[1, 2, 8, 8, 16])
// LOWER: vectorize
// LOWER: fuse_epilogue(t0)
// LOWER: implementation conv.blocked (epi=0 mr=8 nb=1 rows=1) by priority
// LOWER-NEXT: kernel Clip(p0:f32[1, 2, 8, 8, 16], p1:f32[2, 3, 3, 16]
// LOWER: fuse_epilogue(t0)
// The channels-last FromBlocked with the Relu that reads it: the template
// schedules the Relu's stage with the FromBlocked inlined, each vector one
// position's 16 lanes (the second tile of 24 channels overlaps the first).
// LOWER: kernel kiln_k{{[0-9]+}}_Relu for Relu{{$}}
// LOWER-NEXT: implementation layout.from_blocked_cl (ct=16) by priority
// LOWER-NEXT: kernel Relu(p0:f32[1, 2, 8, 8, 16], -> p1:f32[1, 8, 8, 24])
// LOWER: inline(t0)
// LOWER-NEXT: split_overlap(p1, a3, 16)
// LOWER-NEXT: vectorize(p1, a3.i)
// CHECK: after block-layout
// CHECK-DAG: kiln::ConvBlocked(%x, %ws.blk, %bs.blk) {block = 16, channels = 32, in_blocked = 0, pads = [1, 1, 1, 1], strides = [2, 2]}
// CHECK-DAG: %s.blk: f32[1, 2, 8, 8, 16] = Relu(
// CHECK-DAG: kiln::ConvBlocked(%s.blk, %wd.blk) {block = 16, channels = 32, group = 32, in_blocked = 1, pads = [1, 1, 1, 1]}
// CHECK-DAG: %p.blk: f32[1, 2, 8, 8, 16] = kiln::ConvBlocked(%d.blk, %wp.blk) {block = 16, channels = 24, in_blocked = 1}
// CHECK-DAG: %wp.blk: f32[2, 2, 1, 1, 16, 16] = const
// CHECK-DAG: Mul(%p.blk, %bn.scale.blk)
// CHECK-DAG: %dv.blk: f32[1, 2, 8, 8, 16] = Div(%bn.blk, %dvs.blk)
// CHECK-DAG: %m.blk: f32[1, 2, 4, 4, 16] = MaxPool(%r.blk) {kernel_shape = [3, 3, 1], pads = [1, 1, 0, 1, 1, 0], strides = [2, 2, 1]}
// CHECK-DAG: Concat(%m3.blk, %m2.blk) {axis = 1}
// CHECK-DAG: %pd.blk: f32[1, 2, 10, 10, 16] = Pad(%r.blk, %pads.blk)
// CHECK-DAG: %pads.blk: i64[10] {{.*}}= const<i64[10] [0, 0, 1, 1, 0, 0, 0, 1, 1, 0]>
// CHECK-DAG: %ap.blk: f32[1, 2, 8, 8, 16] = AveragePool(%pd.blk) {kernel_shape = [3, 3, 1]}
// CHECK-DAG: %ap: f32[1, 24, 8, 8] = kiln::FromBlocked(%ap.blk) {block = 16, channels = 24}
// CHECK-DAG: Split(%cc.blk) {axis = 1, split = [2, 2]}
// CHECK-DAG: ReduceMean(%sp1.blk) {axes = [2, 3], keepdims = 1}
// CHECK-DAG: %o: f32[1, 32, 1, 1] = kiln::FromBlocked(%o.blk) {block = 16, channels = 32}
// CHECK-DAG: %q.blk: f32[1, 1, 8, 8, 16] = kiln::ConvBlocked(%wz.blk, %ww.blk)
// CHECK-DAG: %m3.blk: f32[1, 2, 4, 4, 16] = kiln::ConvBlocked(%m.blk, %w2.blk) {block = 16, channels = 32, in_blocked = 1}
// CHECK-DAG: %q: f32[1, 16, 8, 8] = kiln::FromBlocked(%q.blk)
// CHECK-DAG: %t: f32[1, 4, 4, 32] = kiln::FromBlocked(%sp2.blk) {block = 16, channels = 32, channels_last = 1}
// CHECK-DAG: %tl.cl: f32[1, 8, 8, 24] = kiln::FromBlocked(%r.blk) {block = 16, channels = 24, channels_last = 1}
// CHECK-DAG: %tr: f32[1, 8, 8, 24] = Relu(%tl.cl)
// CHECK-DAG: %tb.blk: f32[1, 2, 8, 8, 16] = kiln::ToBlocked(%tr) {block = 16, channels_last = 1}
// CHECK-DAG: %ls.blk: f32[1, 2, 8, 8, 16] = Mul(%tb.blk, %dvs.blk
// CHECK-DAG: Add(%ls.blk, %r.blk)
// CHECK-DAG: %tb2.blk: f32[1, 2, 8, 8, 16] = kiln::ToBlocked(%tr) {block = 16, channels_last = 1}
// CHECK-DAG: kiln::ConvBlocked(%tb2.blk, %w2.blk) {block = 16, channels = 32, in_blocked = 1}
// CHECK-DAG: %f: f32[1, 16, 8, 8] = Conv(%wz.nchw, %w5) {pads = [0, 2, 0, 2]}
// CHECK-NOT: Transpose
'''
inp="%x: f32[1, 3, 16, 16]"
b=""
b+=const("ws",[32,3,3,3]); b+=const("bs",[32])
b+=const("wd",[32,1,3,3]); b+=const("wp",[24,32,1,1])
b+=const("sc",[24],0.5,1.5); b+=const("bb",[24]); b+=const("mu",[24]); b+=const("var",[24],0.5,2)
b+=const("dvs",[24,1,1],0.5,2)
b+=const("wr",[24,24,1,1])
b+=const("w2",[32,24,1,1]); b+=const("ww",[16,32,3,3]); b+=const("w5",[16,32,1,5])
b+=const("wzw",[32,32,1,1])
b+='''  %lo: f32[] = const<f32[] [0]>
  %hi: f32[] = const<f32[] [6]>
  %s0: f32[?] = Conv(%x, %ws, %bs) {pads = [1, 1, 1, 1], strides = [2, 2]}
  %s: f32[?] = Relu(%s0)
  %d0: f32[?] = Conv(%s, %wd) {group = 32, pads = [1, 1, 1, 1]}
  %d: f32[?] = Clip(%d0, %lo, %hi)
  %p: f32[?] = Conv(%d, %wp)
  %bn: f32[?] = BatchNormalization(%p, %sc, %bb, %mu, %var)
  %dv: f32[?] = Div(%bn, %dvs)
  %rr: f32[?] = Conv(%dv, %wr)
  %r: f32[?] = Add(%rr, %dv)
  %pads: i64[8] = const<i64[8] [0, 0, 1, 1, 0, 0, 1, 1]>
  %pd: f32[?] = Pad(%r, %pads)
  %ap: f32[?] = AveragePool(%pd) {kernel_shape = [3, 3]}
  %m: f32[?] = MaxPool(%r) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}
  %r2: f32[?] = Conv(%r, %w2) {strides = [2, 2]}
  %m2: f32[?] = Relu(%r2)
  %m3: f32[?] = Conv(%m, %w2)
  %cc: f32[?] = Concat(%m3, %m2) {axis = 1}
  %sp1: f32[?], %sp2: f32[?] = Split(%cc) {axis = 1, split = [32, 32]}
  %g: f32[?] = GlobalAveragePool(%sp1)
  %o: f32[?] = Identity(%g)
  %wz: f32[?] = Conv(%s, %wzw)
  %q: f32[?] = Conv(%wz, %ww) {pads = [1, 1, 1, 1]}
  %f: f32[?] = Conv(%wz, %w5) {pads = [0, 2, 0, 2]}
  %t: f32[?] = Transpose(%sp2) {perm = [0, 2, 3, 1]}
  %tl: f32[?] = Transpose(%r) {perm = [0, 2, 3, 1]}
  %tr: f32[?] = Relu(%tl)
  %tb: f32[?] = Transpose(%tr) {perm = [0, 3, 1, 2]}
  %ls: f32[?] = Mul(%tb, %dvs)
  %res: f32[?] = Add(%ls, %r)
  %tb2: f32[?] = Transpose(%tr) {perm = [0, 3, 1, 2]}
  %tc: f32[?] = Conv(%tb2, %w2)
'''
print(hdr+f'graph main({inp}) -> (%o, %q, %f, %t, %d, %ap, %res, %tc) {{\n  opset "" 13\n{b}}}')
