/* kernels/cpu/cpu_backend.c: written next */
