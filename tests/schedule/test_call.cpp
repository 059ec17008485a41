// tests/schedule/test_call.cpp — a call's record (schedule/call.hpp): its description unpacks into
// the record it was packed from, for every collective, rooted or not, a barrier's included; the
// chained call word tells calls and histories apart; call_text words it.
#include <doctest/doctest.h>

#include <braid/comm/validate.hpp>
#include <braid/schedule/call.hpp>

#include <vector>

#include <cstdint>

namespace {

using braid::algo;
using braid::collective;
using braid::dtype;
using braid::op_kind;
namespace d = braid::detail;

// The description of a call, and its record, of T under Op.
template <class T, class Op> d::call_description D(collective c, algo a, std::uint64_t count, int root, std::uint64_t number) {
  return d::describe(d::record_of<T, Op>(c, a, count, root, number));
}
template <class T, class Op> d::call_record R(collective c, algo a, std::uint64_t count, int root, std::uint64_t number) {
  return d::record_of<T, Op>(c, a, count, root, number);
}

template <class T, class Op> void round_trip(collective c, algo a, std::uint64_t count, int root, std::uint64_t number) {
  const d::call_record f = d::unpack(d::describe(d::record_of<T, Op>(c, a, count, root, number)));
  const bool rooted = c == collective::broadcast || c == collective::reduce;
  CHECK(f.coll == c);
  CHECK(f.type == braid::dtype_of_v<T>);
  CHECK(f.op == braid::op_kind_v<Op>);
  CHECK(f.algorithm == a);
  CHECK(f.elem_size == sizeof(T));
  CHECK(f.count == count);
  CHECK(f.root == (rooted ? root : 0));
  CHECK(f.number == number);
}

} // namespace

TEST_CASE("call record: a description unpacks into the record it was packed from") {
  for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                       collective::reduce}) {
    round_trip<float, braid::sum<>>(c, algo::automatic, 1000, 0, 1);
    round_trip<double, braid::max<>>(c, algo::ring, 1, 3, 77);
    round_trip<std::int8_t, braid::min<>>(c, algo::tree, std::uint64_t{1} << 40, 62, 1u << 20);
    round_trip<braid::bfloat16, braid::avg<>>(c, algo::one_shot, 7, 1, 2);
  }
  const d::call_record b = d::unpack(d::describe(d::barrier_record(9)));
  CHECK(b.coll == collective::barrier);
  CHECK(b.count == 0);
  CHECK(b.root == 0);
  CHECK(b.number == 9);
}

TEST_CASE("call record: the chained word differs with any field of the call or of an earlier call") {
  const auto word = [](std::uint64_t prev, const d::call_description& x) { return d::chain_call_word(prev, x, 0); };
  const d::call_description base = D<float, braid::sum<>>(collective::all_reduce, algo::automatic, 100, 0, 1);
  const std::uint64_t w = word(0, base);
  CHECK(w == word(0, base));
  CHECK(w != word(1, base)); // another history
  CHECK(w != word(0, D<float, braid::sum<>>(collective::all_reduce, algo::automatic, 101, 0, 1)));
  CHECK(w != word(0, D<double, braid::sum<>>(collective::all_reduce, algo::automatic, 100, 0, 1)));
  CHECK(w != word(0, D<float, braid::max<>>(collective::all_reduce, algo::automatic, 100, 0, 1)));
  CHECK(w != word(0, D<float, braid::sum<>>(collective::all_reduce, algo::ring, 100, 0, 1)));
  CHECK(w != word(0, D<float, braid::sum<>>(collective::reduce_scatter, algo::automatic, 100, 0, 1)));
  CHECK(w != word(0, D<float, braid::sum<>>(collective::all_reduce, algo::automatic, 100, 0, 2)));
  CHECK(word(0, D<float, braid::sum<>>(collective::broadcast, algo::automatic, 100, 0, 1)) !=
        word(0, D<float, braid::sum<>>(collective::broadcast, algo::automatic, 100, 1, 1)));
  CHECK(w != word(0, d::describe(d::barrier_record(1))));
  CHECK(d::chain_call_word(0, base, 1) != w); // the host transport's salt (the call's first round)
}

TEST_CASE("call record: call_text words a description for mismatch messages") {
  CHECK(d::call_text(R<float, braid::sum<>>(collective::all_reduce, algo::ring, 1000, 3, 5)) ==
        "all_reduce of 1000 float (4-byte elements), operator sum");
  CHECK(d::call_text(R<double, braid::max<>>(collective::reduce, algo::automatic, 7, 2, 1)) ==
        "reduce of 7 double (8-byte elements), operator max, root 2");
  CHECK(d::call_text(d::barrier_record(4)) == "barrier");
}

TEST_CASE("call record: validate_call fills what this rank reads and writes") {
  std::vector<float> buf(4 * 10);
  const braid::error_context ctx{1, "test", 1, -1};
  // reduce_scatter of 10 per rank on 4 ranks: reads 40, writes 10; in place is out == in + rank * count.
  d::call_record k = d::validate_call<collective::reduce_scatter, float, braid::sum<>>(buf.data(), buf.data() + 10, 10, 0, 4, 1,
                                                                                       algo::automatic, ctx);
  CHECK(k.coll == collective::reduce_scatter);
  CHECK(k.type == dtype::float32);
  CHECK(k.op == op_kind::sum);
  CHECK(k.elem_size == 4);
  CHECK(k.count == 10);
  CHECK(k.in_n == 40);
  CHECK(k.out_n == 10);
  CHECK(k.in_bytes() == 160);
  CHECK(k.reads_in);
  CHECK(k.writes_out);
  CHECK(k.in_place);
  CHECK(k.in == buf.data());
  CHECK(k.out == buf.data() + 10);
  CHECK(k.in_desc == 0);
  CHECK(k.number == 0);
  // all_gather: reads 10, writes 40.
  k = d::validate_call<collective::all_gather, float, d::copy_only>(buf.data(), buf.data() + 10 * 2, 10, 0, 4, 1, algo::ring, ctx);
  CHECK(k.in_n == 10);
  CHECK(k.out_n == 40);
  CHECK_FALSE(k.in_place); // in place is in == out + rank * count
  CHECK(k.algorithm == algo::ring);
  // broadcast on a non-root reads nothing; reduce on a non-root writes nothing; roots are kept.
  k = d::validate_call<collective::broadcast, float, d::copy_only>(buf.data(), buf.data() + 20, 10, 2, 4, 1, algo::automatic, ctx);
  CHECK_FALSE(k.reads_in);
  CHECK(k.writes_out);
  CHECK(k.root == 2);
  k = d::validate_call<collective::reduce, float, braid::max<>>(buf.data(), buf.data() + 20, 10, 3, 4, 1, algo::automatic, ctx);
  CHECK(k.reads_in);
  CHECK_FALSE(k.writes_out);
  CHECK(k.root == 3);
  CHECK(d::unpack(d::describe(k)).root == 3);
  // Input and output that overlap outside the in-place form are refused before anything is touched.
  CHECK_THROWS_AS((d::validate_call<collective::all_reduce, float, braid::sum<>>(buf.data(), buf.data() + 1, 10, 0, 4, 1,
                                                                                algo::automatic, ctx)),
                  braid::error);
}
