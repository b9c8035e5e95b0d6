/* fakecuda_test: what the stand-in driver offers tests beyond the driver API: a held stream
 * models a slow GPU, so stream order, pending events and pending frees can be observed. */
#ifndef FAKECUDA_TEST_H
#define FAKECUDA_TEST_H

#include <cuda.h>

/* on != 0: work submitted to s from now on queues (kernels, copies, memsets, host functions,
 * event records, stream-ordered frees, waits); cuEventQuery of an event whose record is queued
 * answers CUDA_ERROR_NOT_READY, and streams waiting for it queue behind it. on == 0: the queue
 * runs in order and unblocks streams that wait for it. A synchronize of held work (stream,
 * event, context, the checkpoint lock) releases the hold first, as a slow GPU would finish.
 * Only streams of cuStreamCreate* can be held: CUDA_ERROR_INVALID_HANDLE otherwise. */
CUresult fake_stream_hold(CUstream s, int on);

#endif
