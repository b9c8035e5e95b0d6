/* shim_main: libgcr.so's entry: the load-time setup (settings, the real dlsym, the function
 * that starts serving), run by the constructor or by whichever runtime hook comes first. */
#ifndef SHIM_MAIN_H
#define SHIM_MAIN_H

/* Idempotent and thread-safe: a runtime's initialisation that may run before the library's
 * constructor (CUDA's cuInit wrapper) calls it before it serves. */
void shim_main_setup(void);

#endif
