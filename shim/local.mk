# shim/: libgcr.so, loaded with LD_PRELOAD into the GPU process.
