// main.cu compiled by the host compiler for braid's emulated CUDA device (link braid::emu).
#include "main.cu"
