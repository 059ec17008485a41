// bench/onednn-probes/bnorm_layout.cpp — oneDNN batch normalisation (training forward + backward, scale and
// shift) on [128,16,28,28] in NCHW, nChw16c and NHWC, 1 thread: median [min-max] of 10 rounds of 5.
//   g++ -O2 -std=c++20 bnorm_layout.cpp -ldnnl -o bnorm_layout && OMP_NUM_THREADS=1 ./bnorm_layout
#include <oneapi/dnnl/dnnl.hpp>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <vector>
using namespace dnnl;
int main(){
  engine eng(engine::kind::cpu,0); stream st(eng);
  for (auto tg : {memory::format_tag::nchw, memory::format_tag::nChw16c, memory::format_tag::nhwc}) {
  memory::desc d({128,16,28,28}, memory::data_type::f32, tg);
  using nf = normalization_flags; nf fl = nf::use_scale|nf::use_shift;
  batch_normalization_forward::primitive_desc fpd({prop_kind::forward_training, d, 1e-5f, fl}, eng);
  batch_normalization_backward::primitive_desc bpd({prop_kind::backward, d, d, 1e-5f, fl}, eng, fpd);
  memory x(d,eng), y(d,eng), dx(d,eng), sc(fpd.mean_desc(),eng), sh(fpd.mean_desc(),eng), mu(fpd.mean_desc(),eng), var(fpd.mean_desc(),eng), ds(fpd.mean_desc(),eng), dh(fpd.mean_desc(),eng);
  float* p=(float*)x.get_data_handle(); for(size_t i=0;i<d.get_size()/4;i++) p[i]=float(i%97)*0.01f;
  float* q=(float*)sc.get_data_handle(); for(int i=0;i<16;i++) q[i]=1;
  batch_normalization_forward f(fpd); batch_normalization_backward b(bpd);
  std::vector<double> t;
  for(int r=0;r<10;r++){ auto t0=std::chrono::steady_clock::now();
    for(int i=0;i<5;i++){ f.execute(st,{{DNNL_ARG_SRC,x},{DNNL_ARG_DST,y},{DNNL_ARG_SCALE,sc},{DNNL_ARG_SHIFT,sh},{DNNL_ARG_MEAN,mu},{DNNL_ARG_VARIANCE,var}});
      b.execute(st,{{DNNL_ARG_SRC,x},{DNNL_ARG_DIFF_DST,y},{DNNL_ARG_DIFF_SRC,dx},{DNNL_ARG_SCALE,sc},{DNNL_ARG_SHIFT,sh},{DNNL_ARG_MEAN,mu},{DNNL_ARG_VARIANCE,var},{DNNL_ARG_DIFF_SCALE,ds},{DNNL_ARG_DIFF_SHIFT,dh}}); }
    t.push_back(std::chrono::duration<double,std::milli>(std::chrono::steady_clock::now()-t0).count()/5);}
  std::sort(t.begin(),t.end());
  printf("%s: %.2f ms [%.2f-%.2f]\n", fpd.impl_info_str(), t[5], t[0], t[9]);
  }
}
