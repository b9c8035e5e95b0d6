/* shim_hip_alloc: the HIP allocation entry points. They keep their records in the allocation
 * table CUDA uses (shim_alloc), so one suspend moves either vendor's buffers. */
#ifndef SHIM_HIP_ALLOC_H
#define SHIM_HIP_ALLOC_H

/* Whether the process ever allocated through HIP. */
int shim_hip_alloc_used(void);

#endif
