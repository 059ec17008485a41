// tests/schedule/test_call_word.cpp — a call's description (schedule/call_word.hpp) unpacks into the
// fields it was packed from, for every collective, rooted or not, a barrier's included; and the
// chained call word tells calls and histories apart.
#include <doctest/doctest.h>

#include <braid/schedule/call_word.hpp>

#include <cstdint>

namespace {

using braid::algo;
using braid::collective;
using braid::dtype;
using braid::op_kind;
namespace d = braid::detail;

template <class T, class Op> void round_trip(collective c, algo a, std::uint64_t count, int root, std::uint64_t number) {
  const d::call_fields f = d::unpack_call(d::describe_call<T, Op>(c, a, count, root, number));
  const bool rooted = c == collective::broadcast || c == collective::reduce;
  CHECK(f.coll == c);
  CHECK(f.typed);
  CHECK(f.type == braid::dtype_of_v<T>);
  CHECK(f.op == braid::op_kind_v<Op>);
  CHECK(f.algorithm == a);
  CHECK(f.elem_size == sizeof(T));
  CHECK(f.count == count);
  CHECK(f.root == (rooted ? root : -1));
  CHECK(f.number == number);
}

} // namespace

TEST_CASE("call_word: a description unpacks into the fields it was packed from") {
  for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                       collective::reduce}) {
    round_trip<float, braid::sum<>>(c, algo::automatic, 1000, 0, 1);
    round_trip<double, braid::max<>>(c, algo::ring, 1, 3, 77);
    round_trip<std::int8_t, braid::min<>>(c, algo::tree, std::uint64_t{1} << 40, 62, 1u << 20);
    round_trip<braid::bfloat16, braid::avg<>>(c, algo::one_shot, 7, 1, 2);
  }
  const d::call_fields b = d::unpack_call(d::describe_barrier(9));
  CHECK(b.coll == collective::barrier);
  CHECK_FALSE(b.typed);
  CHECK(b.count == 0);
  CHECK(b.root == -1);
  CHECK(b.number == 9);
}

TEST_CASE("call_word: the chained word differs with any field of the call or of an earlier call") {
  const auto word = [](std::uint64_t prev, const d::call_description& x) { return d::chain_call_word(prev, x, 0); };
  const d::call_description base = d::describe_call<float, braid::sum<>>(collective::all_reduce, algo::automatic, 100, 0, 1);
  const std::uint64_t w = word(0, base);
  CHECK(w == word(0, base));
  CHECK(w != word(1, base)); // another history
  CHECK(w != word(0, d::describe_call<float, braid::sum<>>(collective::all_reduce, algo::automatic, 101, 0, 1)));
  CHECK(w != word(0, d::describe_call<double, braid::sum<>>(collective::all_reduce, algo::automatic, 100, 0, 1)));
  CHECK(w != word(0, d::describe_call<float, braid::max<>>(collective::all_reduce, algo::automatic, 100, 0, 1)));
  CHECK(w != word(0, d::describe_call<float, braid::sum<>>(collective::all_reduce, algo::ring, 100, 0, 1)));
  CHECK(w != word(0, d::describe_call<float, braid::sum<>>(collective::reduce_scatter, algo::automatic, 100, 0, 1)));
  CHECK(w != word(0, d::describe_call<float, braid::sum<>>(collective::all_reduce, algo::automatic, 100, 0, 2)));
  CHECK(word(0, d::describe_call<float, braid::sum<>>(collective::broadcast, algo::automatic, 100, 0, 1)) !=
        word(0, d::describe_call<float, braid::sum<>>(collective::broadcast, algo::automatic, 100, 1, 1)));
  CHECK(w != word(0, d::describe_barrier(1)));
  CHECK(d::chain_call_word(0, base, 1) != w); // the host transport's salt (the call's first round)
}

TEST_CASE("call_word: call_text words a description for mismatch messages") {
  CHECK(d::call_text(d::describe_call<float, braid::sum<>>(collective::all_reduce, algo::ring, 1000, 3, 5)) ==
        "all_reduce of 1000 float (4-byte elements), operator sum");
  CHECK(d::call_text(d::describe_call<double, braid::max<>>(collective::reduce, algo::automatic, 7, 2, 1)) ==
        "reduce of 7 double (8-byte elements), operator max, root 2");
  CHECK(d::call_text(d::describe_barrier(4)) == "barrier");
}
