// Schedules are data: an ordered list of primitive applications that can be
// printed, parsed, stored, and replayed onto a KernelDef's lowering.
//
// Text form, one primitive per line:
//   inline(stage)
//   split(stage, axis, factor)        -> axes axis.o and axis.i
//   split_overlap(stage, axis, factor) -> like split, for a spatial axis with a
//                                        constant extent >= factor: the last tile
//                                        is shifted back to end at the extent
//                                        (overlapping the previous one) instead
//                                        of being guarded
//   split_padded(stage, axis, factor) -> like split, but only the stores to
//                                        the stage's buffer are guarded: a
//                                        reduction computes the padded tile in
//                                        full and writes back its valid part.
//                                        Legal only where every load along the
//                                        axis reads a buffer padded to a
//                                        multiple of the factor (GEMM panels)
//   reorder(stage, a, b, c)           -> loops in this order (outermost first)
//   fuse(stage, a, b)                 -> adjacent spatial loops a (outer) and b
//                                        become one loop a_b of extent(a) *
//                                        extent(b): a 1x1 convolution's rows and
//                                        columns as one contiguous pixel axis
//   parallel(stage, axis)
//   vectorize(stage, axis)
//   unroll(stage, axis)
//   cache_write(stage, axis)          -> accumulate the stage in a local buffer
//                                        allocated at `axis`, moving reduce loops
//                                        outside the loops below `axis`
//   rfactor(stage, axis)              -> for a reduce axis of constant extent
//                                        (at most 64, usually the inner half of a
//                                        split): the reduction runs it innermost
//                                        as vector lanes, each accumulating a
//                                        partial in a local buffer, combined
//                                        into the result after the reduce loops.
//                                        For a reduction along a contiguous dim
//                                        (softmax's row max, layer norm's mean),
//                                        which otherwise vectorizes across rows
//                                        with gathers. Reassociates the combiner
//                                        (sum, prod, max, min)
//   hoist_reduce(stage, r [, axis])   -> for a reduction: reduce loop r (the
//                                        outer half of a split reduce axis) runs
//                                        outside the cache_write tile, just
//                                        inside spatial loop `axis` (outermost
//                                        without it): cache blocking of the
//                                        reduction. The tile starts from the
//                                        init at r = 0 and from the partial
//                                        sums in the stage's buffer otherwise,
//                                        and stores partial sums there until the
//                                        last r, which writes the result (and
//                                        the fused epilogue). A GEMM's weight
//                                        panel is then used in blocks that stay
//                                        in cache across the row tiles
//   prefetch(stage, axis [, distance]) -> for a reduction: each reduce step also
//                                        prefetches (into L2) what the iteration
//                                        `distance` (default 1) ahead of spatial
//                                        loop `axis` will
//                                        read from the params whose index uses
//                                        it, so a GEMM's next weight panel
//                                        streams from memory while the current
//                                        one is used from cache. A hint only
//   pack(stage, buffer, axis [, lanes]) -> for a reduction: at the start of each
//                                        iteration of loop `axis` (outside the
//                                        cache_write tile; a hoisted reduce loop
//                                        counts), the region of input `buffer`
//                                        that the loops below it read is copied
//                                        into a local buffer, which the stage
//                                        reads instead. Its dims are the loops
//                                        below `axis` that the load's index
//                                        uses, in nest order (a GEMM's A block
//                                        as [row tiles][k][rows of a tile]: one
//                                        contiguous stream per tile). The copy's
//                                        innermost loop runs in vectors of
//                                        `lanes` where the load is contiguous
//                                        along it. The stage must read `buffer`
//                                        at one index
//   fuse_epilogue(stage)              -> for a reduction: the next stage that is
//                                        not inlined, when it is elementwise over
//                                        the same shape and reads this stage only
//                                        at its own point (bias, activation,
//                                        residual add), is computed in this
//                                        stage's write-back (on the register tile)
//                                        and stored in its place: this stage's
//                                        buffer is never written. Otherwise
//                                        nothing changes (a request, always legal)
//   fuse_epilogue(stage, axis)        -> the same epilogue, deferred: the stage
//                                        writes its own buffer, and after each
//                                        iteration of spatial loop `axis`
//                                        (outside the cache_write tile) the
//                                        epilogue is computed over the points
//                                        that iteration wrote, from cache. For
//                                        an expensive activation after a short
//                                        reduction (depthwise), whose latency
//                                        in the write-back no tile overlaps
//   compute_at(stage, consumer, axis) -> stage (an intermediate) is computed
//                                        inside loop `axis` of `consumer`, for
//                                        the region one iteration reads, into a
//                                        buffer of that region allocated there
//                                        (a block of score rows instead of the
//                                        whole matrix). The consumer's loops
//                                        from the outermost through `axis` must
//                                        be the stage's outermost loops (same
//                                        names and extents: split both alike);
//                                        every stage reading it must be the
//                                        consumer or computed at the same place,
//                                        and read each dim that depends on those
//                                        loops at the stage's own index there.
//                                        A dim that depends on them holds one
//                                        region of constant size; other dims
//                                        are whole. The stage's own loops run
//                                        serially inside the consumer's
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "support/status.h"
#include "tir/tir.h"

namespace kiln::tir {

struct Primitive {
  std::string kind;  // inline, split, reorder, parallel, vectorize, unroll, cache_write, rfactor, hoist_reduce, prefetch, pack, fuse_epilogue, compute_at
  std::string stage;
  std::vector<std::string> axes;
  int64_t factor = 0;
};

struct Schedule {
  std::vector<Primitive> prims;
  std::string to_string() const;
};

Result<Schedule> parse_schedule(std::string_view text);

// The reference: every stage materialized (no inlining), serial loops, no tricks.
Schedule naive_schedule(const KernelDef& k);
// Intermediate elementwise stages inlined (except those a reduction reads
// through a sliding window, like a padded conv input: materialized), outermost
// non-trivial loop parallel, innermost spatial loop vectorized where legal.
// Reductions whose innermost axis indexes a contiguous dim are register tiled
// (rows x 16 vector lanes accumulated in a local tile, reduce loops outside it).
Schedule default_schedule(const KernelDef& k);

// Appends the default schedule's plain form of reduction stage `st` to `s`:
// the innermost two axes' tile accumulated in registers (cache_write) with
// the innermost spatial axis vectorized, where it has at least 8 points,
// and the first outer loop with work parallel. The default schedule uses it
// where neither lane-split (rfactor) nor register-tiled reductions apply;
// the generic space (strategy/generic.cc) offers it in their place.
void plain_reduction_schedule(const ComputeDef& st, Schedule& s);

// Picks the loop to run in parallel among `loops` (outermost first, each with
// its iteration count when known): the first with a known count of at least
// 2, else the first with an unknown count (a symbolic batch is often 1 at run
// time, so a known-large loop after it is the better bet). -1: none. The
// default schedule and the strategy's templates use it.
int choose_parallel(const std::vector<std::optional<int64_t>>& loops);

// Lowers a kernel under a schedule. Errors for a schedule that names unknown
// stages or axes, or is illegal (vectorize a reduce axis, ...).
Result<PrimFunc> lower(const KernelDef& k, const Schedule& s);

}  // namespace kiln::tir
