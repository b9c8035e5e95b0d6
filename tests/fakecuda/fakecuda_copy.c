/* fakecuda_copy: cuMemcpy* and cuMemset* in their synchronous, asynchronous and per-thread
 * (_ptds/_ptsz) forms: argument checks here, the bytes move when the stream runs the op. */
#include "fakecuda.h"

#include <string.h>

/* What each side of a copy may be: HtoD's source is any host memory, its destination must be
 * device-addressable; cuMemcpy's sides are either (unified addressing). */
enum fake_side { FAKE_HOST, FAKE_DEVICE, FAKE_UNIFIED };

/* The per-thread variants differ only in what a NULL stream means. */
static CUstream fake_ptsz(CUstream s)
{
	return s == NULL ? CU_STREAM_PER_THREAD : s;
}

static CUresult fake_side_check(const void *p, size_t n, enum fake_side side, bool write)
{
	if (side == FAKE_HOST)
		return p != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
	return fake_mem_check((CUdeviceptr)(uintptr_t)p, n, write, side == FAKE_UNIFIED);
}

static CUresult fake_copy(void *dst, enum fake_side dside, const void *src, enum fake_side sside,
			  size_t n, CUstream stream)
{
	struct fake_op op = {.kind = FAKE_OP_COPY};
	struct fake_ctx *ctx;
	CUresult rc;

	rc = fake_ctx_current(&ctx);
	if (rc == CUDA_SUCCESS)
		rc = fake_stream_check(stream);
	if (rc != CUDA_SUCCESS || n == 0)
		return rc;
	if (fake_side_check(dst, n, dside, true) != CUDA_SUCCESS ||
	    fake_side_check(src, n, sside, false) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_VALUE;
	op.u.copy.dst = dst;
	op.u.copy.src = src;
	op.u.copy.width = n;
	op.u.copy.height = 1;
	op.u.copy.dpitch = op.u.copy.spitch = n;
	return fake_submit(stream, &op);
}

#define FAKE_PTR(d) ((void *)(uintptr_t)(d))

FAKE_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	FAKE_ENTER("cuMemcpy");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_UNIFIED, FAKE_PTR(src), FAKE_UNIFIED,
				    n, CU_STREAM_LEGACY));
}

FAKE_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	FAKE_ENTER("cuMemcpy");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_UNIFIED, FAKE_PTR(src), FAKE_UNIFIED,
				    n, CU_STREAM_PER_THREAD));
}

FAKE_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemcpyAsync");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_UNIFIED, FAKE_PTR(src), FAKE_UNIFIED,
				    n, s));
}

FAKE_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemcpyAsync");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_UNIFIED, FAKE_PTR(src), FAKE_UNIFIED,
				    n, fake_ptsz(s)));
}

FAKE_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	FAKE_ENTER("cuMemcpyHtoD");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_DEVICE, src, FAKE_HOST,
				    n, CU_STREAM_LEGACY));
}

FAKE_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
	FAKE_ENTER("cuMemcpyHtoD");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_DEVICE, src, FAKE_HOST,
				    n, CU_STREAM_PER_THREAD));
}

FAKE_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	FAKE_ENTER("cuMemcpyDtoH");
	return fake_leave(fake_copy(dst, FAKE_HOST, FAKE_PTR(src), FAKE_DEVICE,
				    n, CU_STREAM_LEGACY));
}

FAKE_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
	FAKE_ENTER("cuMemcpyDtoH");
	return fake_leave(fake_copy(dst, FAKE_HOST, FAKE_PTR(src), FAKE_DEVICE,
				    n, CU_STREAM_PER_THREAD));
}

FAKE_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	FAKE_ENTER("cuMemcpyDtoD");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_DEVICE, FAKE_PTR(src), FAKE_DEVICE,
				    n, CU_STREAM_LEGACY));
}

FAKE_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	FAKE_ENTER("cuMemcpyDtoD");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_DEVICE, FAKE_PTR(src), FAKE_DEVICE,
				    n, CU_STREAM_PER_THREAD));
}

FAKE_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemcpyHtoDAsync");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_DEVICE, src, FAKE_HOST, n, s));
}

FAKE_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n,
					       CUstream s)
{
	FAKE_ENTER("cuMemcpyHtoDAsync");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_DEVICE, src, FAKE_HOST, n, fake_ptsz(s)));
}

FAKE_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemcpyDtoHAsync");
	return fake_leave(fake_copy(dst, FAKE_HOST, FAKE_PTR(src), FAKE_DEVICE, n, s));
}

FAKE_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemcpyDtoHAsync");
	return fake_leave(fake_copy(dst, FAKE_HOST, FAKE_PTR(src), FAKE_DEVICE, n, fake_ptsz(s)));
}

FAKE_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemcpyDtoDAsync");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_DEVICE, FAKE_PTR(src), FAKE_DEVICE, n, s));
}

FAKE_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n,
					       CUstream s)
{
	FAKE_ENTER("cuMemcpyDtoDAsync");
	return fake_leave(fake_copy(FAKE_PTR(dst), FAKE_DEVICE, FAKE_PTR(src), FAKE_DEVICE,
				    n, fake_ptsz(s)));
}

/* ---- 2-D copies ---- */

/* One side of a CUDA_MEMCPY2D: where its first byte is, checked against the memory table
 * when it claims to be device memory. */
static CUresult fake_copy2d_side(CUmemorytype type, const void *host, CUdeviceptr dev, size_t x,
				 size_t y, size_t pitch, size_t width, size_t height, bool write,
				 const char **out)
{
	const char *base;
	size_t extent = (height - 1) * pitch + width;

	if (height > 1 && pitch < width)
		return CUDA_ERROR_INVALID_VALUE;
	switch (type) {
	case CU_MEMORYTYPE_HOST:
		base = host;
		break;
	case CU_MEMORYTYPE_DEVICE:
	case CU_MEMORYTYPE_UNIFIED:
		if (fake_mem_check(dev + y * pitch + x, extent, write,
				   type == CU_MEMORYTYPE_UNIFIED) != CUDA_SUCCESS)
			return CUDA_ERROR_INVALID_VALUE;
		base = FAKE_PTR(dev);
		break;
	case CU_MEMORYTYPE_ARRAY:
		return CUDA_ERROR_NOT_SUPPORTED; /* no CUDA arrays in the fake */
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (base == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*out = base + y * pitch + x;
	return CUDA_SUCCESS;
}

static CUresult fake_copy2d(const CUDA_MEMCPY2D *c, CUstream stream)
{
	struct fake_op op = {.kind = FAKE_OP_COPY};
	struct fake_ctx *ctx;
	const char *src, *dst;
	CUresult rc;

	rc = fake_ctx_current(&ctx);
	if (rc == CUDA_SUCCESS)
		rc = fake_stream_check(stream);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (c == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (c->WidthInBytes == 0 || c->Height == 0)
		return CUDA_SUCCESS;
	rc = fake_copy2d_side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY,
			      c->srcPitch, c->WidthInBytes, c->Height, false, &src);
	if (rc == CUDA_SUCCESS)
		rc = fake_copy2d_side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes,
				      c->dstY, c->dstPitch, c->WidthInBytes, c->Height, true, &dst);
	if (rc != CUDA_SUCCESS)
		return rc;
	op.u.copy.dst = (char *)dst;
	op.u.copy.src = src;
	op.u.copy.dpitch = c->dstPitch;
	op.u.copy.spitch = c->srcPitch;
	op.u.copy.width = c->WidthInBytes;
	op.u.copy.height = c->Height;
	return fake_submit(stream, &op);
}

FAKE_EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *copy)
{
	FAKE_ENTER("cuMemcpy2D");
	return fake_leave(fake_copy2d(copy, CU_STREAM_LEGACY));
}

FAKE_EXPORT CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *copy)
{
	FAKE_ENTER("cuMemcpy2D");
	return fake_leave(fake_copy2d(copy, CU_STREAM_PER_THREAD));
}

FAKE_EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *copy, CUstream s)
{
	FAKE_ENTER("cuMemcpy2DAsync");
	return fake_leave(fake_copy2d(copy, s));
}

FAKE_EXPORT CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *copy, CUstream s)
{
	FAKE_ENTER("cuMemcpy2DAsync");
	return fake_leave(fake_copy2d(copy, fake_ptsz(s)));
}

/* ---- memset ---- */

/* width in elements of elem bytes; pitch in bytes (ignored when height is 1). */
static CUresult fake_set(CUdeviceptr dst, size_t pitch, uint32_t value, unsigned int elem,
			 size_t width, size_t height, CUstream stream)
{
	struct fake_op op = {.kind = FAKE_OP_SET};
	struct fake_ctx *ctx;
	CUresult rc;

	rc = fake_ctx_current(&ctx);
	if (rc == CUDA_SUCCESS)
		rc = fake_stream_check(stream);
	if (rc != CUDA_SUCCESS || width == 0 || height == 0)
		return rc;
	if (height == 1)
		pitch = width * elem;
	if (dst % elem != 0 || pitch < width * elem || pitch % elem != 0 ||
	    fake_mem_check(dst, (height - 1) * pitch + width * elem, true, false) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_VALUE;
	op.u.set.dst = FAKE_PTR(dst);
	op.u.set.pitch = pitch;
	op.u.set.width = width;
	op.u.set.height = height;
	op.u.set.value = value;
	op.u.set.elem = elem;
	return fake_submit(stream, &op);
}

FAKE_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n)
{
	FAKE_ENTER("cuMemsetD8");
	return fake_leave(fake_set(dst, 0, v, 1, n, 1, CU_STREAM_LEGACY));
}

FAKE_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char v, size_t n)
{
	FAKE_ENTER("cuMemsetD8");
	return fake_leave(fake_set(dst, 0, v, 1, n, 1, CU_STREAM_PER_THREAD));
}

FAKE_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short v, size_t n)
{
	FAKE_ENTER("cuMemsetD16");
	return fake_leave(fake_set(dst, 0, v, 2, n, 1, CU_STREAM_LEGACY));
}

FAKE_EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr dst, unsigned short v, size_t n)
{
	FAKE_ENTER("cuMemsetD16");
	return fake_leave(fake_set(dst, 0, v, 2, n, 1, CU_STREAM_PER_THREAD));
}

FAKE_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n)
{
	FAKE_ENTER("cuMemsetD32");
	return fake_leave(fake_set(dst, 0, v, 4, n, 1, CU_STREAM_LEGACY));
}

FAKE_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int v, size_t n)
{
	FAKE_ENTER("cuMemsetD32");
	return fake_leave(fake_set(dst, 0, v, 4, n, 1, CU_STREAM_PER_THREAD));
}

FAKE_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemsetD8Async");
	return fake_leave(fake_set(dst, 0, v, 1, n, 1, s));
}

FAKE_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemsetD8Async");
	return fake_leave(fake_set(dst, 0, v, 1, n, 1, fake_ptsz(s)));
}

FAKE_EXPORT CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemsetD16Async");
	return fake_leave(fake_set(dst, 0, v, 2, n, 1, s));
}

FAKE_EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr dst, unsigned short v, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemsetD16Async");
	return fake_leave(fake_set(dst, 0, v, 2, n, 1, fake_ptsz(s)));
}

FAKE_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemsetD32Async");
	return fake_leave(fake_set(dst, 0, v, 4, n, 1, s));
}

FAKE_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int v, size_t n, CUstream s)
{
	FAKE_ENTER("cuMemsetD32Async");
	return fake_leave(fake_set(dst, 0, v, 4, n, 1, fake_ptsz(s)));
}

FAKE_EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr dst, size_t pitch, unsigned char v, size_t w,
				     size_t h)
{
	FAKE_ENTER("cuMemsetD2D8");
	return fake_leave(fake_set(dst, pitch, v, 1, w, h, CU_STREAM_LEGACY));
}

FAKE_EXPORT CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr dst, size_t pitch, unsigned char v, size_t w,
					  size_t h)
{
	FAKE_ENTER("cuMemsetD2D8");
	return fake_leave(fake_set(dst, pitch, v, 1, w, h, CU_STREAM_PER_THREAD));
}

FAKE_EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr dst, size_t pitch, unsigned int v, size_t w,
				      size_t h)
{
	FAKE_ENTER("cuMemsetD2D32");
	return fake_leave(fake_set(dst, pitch, v, 4, w, h, CU_STREAM_LEGACY));
}

FAKE_EXPORT CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr dst, size_t pitch, unsigned int v, size_t w,
					   size_t h)
{
	FAKE_ENTER("cuMemsetD2D32");
	return fake_leave(fake_set(dst, pitch, v, 4, w, h, CU_STREAM_PER_THREAD));
}
