// token_batch: the inputs and next-token targets a language model trains on, and row_range, the
// rows of a global batch one rank (or one micro-batch) takes.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace quintet {

// Rows [begin, end) of a global batch. Rows are numbered globally, so the same row holds the same
// tokens whichever rank (or micro-batch) asks for it.
struct row_range {
  std::int64_t begin = 0;
  std::int64_t end = 0;

  constexpr std::int64_t size() const { return end - begin; }
  friend constexpr bool operator==(const row_range&, const row_range&) = default;
};

// Sources key their random draws by (seed, step, row) and give every row 2^32 draws, so rows are
// limited to 31 bits and a window to fewer than 2^32 tokens.
inline constexpr std::int64_t max_batch_rows = std::int64_t{1} << 31;
inline constexpr std::int64_t max_sequence_length = (std::int64_t{1} << 32) - 2;

// Part `index` of `parts` equal parts of `whole`: the rows a data-parallel rank takes
// (split_rows({0, global_batch}, dp, dp_rank)), or one micro-batch of a rank's rows.
//
//   global batch rows:  [ 0 1 2 3 | 4 5 6 7 | 8 9 10 11 ]   split_rows({0, 12}, 3, r)
//                         rank 0    rank 1    rank 2
inline row_range split_rows(row_range whole, std::int64_t parts, std::int64_t index) {
  QUINTET_CHECK(whole.begin >= 0 && whole.begin <= whole.end,
                "row range [{}, {}) is not a valid range of batch rows", whole.begin, whole.end);
  QUINTET_CHECK(parts >= 1, "cannot split rows [{}, {}) into {} parts", whole.begin, whole.end,
                parts);
  QUINTET_CHECK(whole.size() % parts == 0,
                "{} rows [{}, {}) do not split into {} equal parts (the batch must be divisible "
                "by the number of ranks or micro-batches)",
                whole.size(), whole.begin, whole.end, parts);
  QUINTET_CHECK(index >= 0 && index < parts,
                "part {} is out of range for {} parts of rows [{}, {})", index, parts, whole.begin,
                whole.end);
  const std::int64_t part_size = whole.size() / parts;
  return {whole.begin + index * part_size, whole.begin + (index + 1) * part_size};
}

// A request every token source validates the same way: a non-negative step, a non-empty range of
// rows within the addressable rows, and a positive sequence length.
inline void check_batch_request(std::int64_t step, row_range rows, std::int64_t seq) {
  QUINTET_CHECK(step >= 0, "batch step {} is negative", step);
  QUINTET_CHECK(rows.begin >= 0 && rows.begin < rows.end && rows.end <= max_batch_rows,
                "batch rows [{}, {}) are out of range: need 0 <= begin < end <= {}", rows.begin,
                rows.end, max_batch_rows);
  QUINTET_CHECK(seq >= 1 && seq <= max_sequence_length,
                "sequence length {} is out of range: need 1 <= seq <= {}", seq,
                max_sequence_length);
}

// Token ids of `rows` rows of a batch: targets are the inputs shifted left by one, so
// targets(r, i) is the token that follows inputs(r, i) in the source.
struct token_batch {
  std::int64_t step = 0;
  row_range rows{};
  tensor<std::int32_t, host> inputs;   // (rows, seq)
  tensor<std::int32_t, host> targets;  // (rows, seq)

  std::int64_t row_count() const { return rows.size(); }
  std::int64_t seq() const { return inputs.extent(1); }
};

// Builds a token_batch from windows of seq + 1 tokens: source.write_window(step, row, window)
// fills the window of global row `row`; inputs take its first seq tokens and targets its last seq.
// The source is passed itself rather than a capturing lambda: this template is instantiated by
// both g++ and nvcc translation units of one program (train_gpt), and the two compilers lay out
// a lambda's captures in different orders, so the one instance the linker keeps would read the
// other compiler's closure wrongly.
//
// token_window_source: what it reads rows from. Requires
//   s.write_window(step, row, window)  fill `window` (seq + 1 tokens) with row `row` of step `step`
template <class Source>
concept token_window_source = requires(const Source& s, std::int64_t step, std::int64_t row,
                                       std::span<std::int32_t> window) {
  s.write_window(step, row, window);
};

template <token_window_source Source>
token_batch assemble_token_batch(const Source& source, std::int64_t step, row_range rows,
                                 std::int64_t seq) {
  check_batch_request(step, rows, seq);
  token_batch batch{.step = step,
                    .rows = rows,
                    .inputs = tensor<std::int32_t, host>(quintet::shape{rows.size(), seq}),
                    .targets = tensor<std::int32_t, host>(quintet::shape{rows.size(), seq})};
  std::vector<std::int32_t> window(static_cast<std::size_t>(seq) + 1);
  for (std::int64_t r = 0; r < rows.size(); ++r) {
    source.write_window(step, rows.begin + r, std::span<std::int32_t>(window));
    std::int32_t* inputs = batch.inputs.data() + r * seq;
    std::int32_t* targets = batch.targets.data() + r * seq;
    for (std::int64_t i = 0; i < seq; ++i) {
      inputs[i] = window[static_cast<std::size_t>(i)];
      targets[i] = window[static_cast<std::size_t>(i) + 1];
    }
  }
  return batch;
}

}  // namespace quintet
