/* kernels/attention.c: written next */
