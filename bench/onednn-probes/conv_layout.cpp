// bench/onednn-probes/conv_layout.cpp — one 3x3 16->16 convolution on [128,16,28,28], 1 thread: oneDNN with
// plain NCHW/OIHW memory (argument absent) or with format_tag::any (argument "any"); prints the
// implementations and 4 rounds of 5 calls each of forward, backward-data, backward-weights (ms per call).
//   g++ -O2 -std=c++20 conv_layout.cpp -ldnnl -o conv_layout && OMP_NUM_THREADS=1 ./conv_layout [any]
#include <oneapi/dnnl/dnnl.hpp>
#include <chrono>
#include <cstdio>
#include <vector>
#include <cstring>
using namespace dnnl;
using tag = memory::format_tag; using dt = memory::data_type;
int main(int argc,char**argv){
  bool any = argc>1 && !strcmp(argv[1],"any");
  engine eng(engine::kind::cpu,0); stream s(eng);
  int N=128,C=16,O=16,H=28,W=28;
  memory::dims src{N,C,H,W}, wei{O,C,3,3}, dst{N,O,H,W}, st{1,1}, pd{1,1};
  auto t = any?tag::any:tag::nchw; auto tw = any?tag::any:tag::oihw;
  memory::desc smd(src,dt::f32,t), wmd(wei,dt::f32,tw), dmd(dst,dt::f32,t);
  auto fd = convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, smd,wmd,dmd,st,pd,pd);
  auto fpd = convolution_forward::primitive_desc(fd,eng);
  printf("fwd impl %s\n", fpd.impl_info_str());
  auto bdd = convolution_backward_data::desc(algorithm::convolution_direct, smd,wmd,dmd,st,pd,pd);
  auto bdpd = convolution_backward_data::primitive_desc(bdd,eng,fpd);
  printf("bwd_d impl %s\n", bdpd.impl_info_str());
  auto bwd = convolution_backward_weights::desc(algorithm::convolution_direct, smd,wmd,dmd,st,pd,pd);
  auto bwpd = convolution_backward_weights::primitive_desc(bwd,eng,fpd);
  printf("bwd_w impl %s\n", bwpd.impl_info_str());
  memory S(fpd.src_desc(),eng), Wt(fpd.weights_desc(),eng), D(fpd.dst_desc(),eng);
  memory dS(bdpd.diff_src_desc(),eng), dD(bwpd.diff_dst_desc(),eng), dW(bwpd.diff_weights_desc(),eng), dDd(bdpd.diff_dst_desc(),eng);
  memory Sw(bwpd.src_desc(),eng), Wd(bdpd.weights_desc(),eng);
  convolution_forward f(fpd); convolution_backward_data bd(bdpd); convolution_backward_weights bw(bwpd);
  for(int r=0;r<4;r++){
    auto t0=std::chrono::steady_clock::now();
    for(int i=0;i<5;i++) f.execute(s,{{DNNL_ARG_SRC,S},{DNNL_ARG_WEIGHTS,Wt},{DNNL_ARG_DST,D}});
    auto t1=std::chrono::steady_clock::now();
    for(int i=0;i<5;i++) bd.execute(s,{{DNNL_ARG_DIFF_SRC,dS},{DNNL_ARG_WEIGHTS,Wd},{DNNL_ARG_DIFF_DST,dDd}});
    auto t2=std::chrono::steady_clock::now();
    for(int i=0;i<5;i++) bw.execute(s,{{DNNL_ARG_SRC,Sw},{DNNL_ARG_DIFF_WEIGHTS,dW},{DNNL_ARG_DIFF_DST,dD}});
    auto t3=std::chrono::steady_clock::now();
    s.wait();
    auto ms=[](auto a,auto b){return std::chrono::duration<double,std::milli>(b-a).count()/5;};
    printf("fwd %.2f ms bwd_d %.2f bwd_w %.2f\n", ms(t0,t1), ms(t1,t2), ms(t2,t3));
  }
}
