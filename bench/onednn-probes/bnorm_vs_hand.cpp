// bench/onednn-probes/bnorm_vs_hand.cpp — batchnorm2d<float> forward+backward, oneDNN on NCHW against braid's
// loops (use_onednn(false)), interleaved, 10 rounds of 5: median [min-max] ms. From the repository root:
//   g++ -O3 -std=c++20 -DBRAID_HAVE_DNNL=1 -Iinclude bench/onednn-probes/bnorm_vs_hand.cpp -ldnnl -lopenblas -o /tmp/bvh
//   OMP_NUM_THREADS=1 /tmp/bvh
#include <braid/nn/layers.hpp>
#include <chrono>
#include <cstdio>
#include <algorithm>
int main(){
  using namespace braid::nn;
  for (auto s : {shape_t{128,16,28,28}, shape_t{128,64,7,7}}) {
  batchnorm2d<float> a{int(s[1])}, b{int(s[1])}; b.use_onednn(false);
  tensor x(s); for (int64_t i=0;i<x.numel();++i) x.data<float>()[i]=float(i%97)*0.01f;
  std::vector<double> ta, tb;
  for (int r=0;r<10;r++) for (int w=0; w<2; ++w) {
    auto& m = w? b : a;
    auto t0=std::chrono::steady_clock::now();
    for(int i=0;i<5;i++){ tensor y=m.forward(x); tensor dx=m.backward(y);}  
    double ms=std::chrono::duration<double,std::milli>(std::chrono::steady_clock::now()-t0).count()/5;
    (w?tb:ta).push_back(ms);
  }
  std::sort(ta.begin(),ta.end()); std::sort(tb.begin(),tb.end());
  printf("%s fwd+bwd: oneDNN median %.2f ms [%.2f-%.2f], hand %.2f ms [%.2f-%.2f]\n", s.str().c_str(), ta[5],ta[0],ta[9], tb[5],tb[0],tb[9]);
  }
}
