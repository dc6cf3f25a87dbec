// The pipeline schedules parallel::pp<...> accepts: the pipeline_schedule concept (any type with
// pipeline traits and a generate(shape) that returns its lists) and the built-in styles, one per
// header. Each built-in generates, verifies, simulates and runs: train::trainer drives the runtime
// (runtime.hpp) over a plan's pp<...> — implemented = true in its traits.
//
//   style             name          chunks  header
//   gpipe             gpipe         1       gpipe.hpp
//   one_f_one_b       1f1b          1       one_f_one_b.hpp
//   interleaved<V>    interleaved   V       interleaved.hpp
//   zb_h1, zb_h2      zb-h1, zb-h2  1       zero_bubble.hpp
//   zb_v              zb-v          2       zb_v.hpp
//   dualpipe_v        dualpipe-v    2       dualpipe_v.hpp
//   bpipe<Base>       bpipe         1       bpipe.hpp
#pragma once

#include <quintet/parallel/pipeline/bpipe.hpp>
#include <quintet/parallel/pipeline/dualpipe_v.hpp>
#include <quintet/parallel/pipeline/gpipe.hpp>
#include <quintet/parallel/pipeline/interleaved.hpp>
#include <quintet/parallel/pipeline/one_f_one_b.hpp>
#include <quintet/parallel/pipeline/schedule_style.hpp>
#include <quintet/parallel/pipeline/zb_v.hpp>
#include <quintet/parallel/pipeline/zero_bubble.hpp>
