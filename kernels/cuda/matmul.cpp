// Matmul through cuBLAS, and the upload of weight matrices.
//
// cuBLAS is column-major. A row-major (d, k) weight is a column-major (k, d) matrix, x (n, k) is (k, n) and
// y (n, d) is (d, n), so y = x · Wᵀ is, column-major, y = Wᵀ x: one GEMM with W transposed.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace shardline::kernels::cuda {

namespace {

// Every cuBLAS status goes through here (cuBLAS' own name and message).
void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw ResourceError(fmt::format("cuBLAS {} failed: {}: {}", what, cublasGetStatusName(status),
                                  cublasGetStatusString(status)));
}

// cuBLAS' recommended workspace on Hopper; a fixed workspace means graph capture allocates nothing.
constexpr std::size_t kWorkspaceBytes = 32u << 20;
// fp32 rows staged at once when converting a matrix to bf16 on the device.
constexpr std::size_t kStagingFloats = 16u << 20;

}  // namespace

DeviceMatrix DeviceMatrix::upload(const float* host_w, std::size_t row_stride, int d, int k, DeviceDtype dtype) {
  SL_CHECK(d > 0 && k > 0 && row_stride >= static_cast<std::size_t>(k));
  DeviceMatrix m;
  m.dtype_ = dtype;
  m.d_ = d;
  m.k_ = k;
  const std::size_t row_bytes = static_cast<std::size_t>(k) * sizeof(float);
  if (dtype == DeviceDtype::kF32) {
    m.buffer_ = DeviceBuffer(static_cast<std::size_t>(d) * row_bytes);
    check_cuda(cudaMemcpy2D(m.buffer_.data(), row_bytes, host_w, row_stride * sizeof(float), row_bytes, d,
                            cudaMemcpyHostToDevice),
               "weight upload");
    return m;
  }
  m.buffer_ = DeviceBuffer(static_cast<std::size_t>(d) * k * sizeof(std::uint16_t));
  const int rows_per_chunk = static_cast<int>(std::clamp<std::size_t>(kStagingFloats / k, 1, d));
  DeviceBuffer staging(static_cast<std::size_t>(rows_per_chunk) * row_bytes);
  for (int row = 0; row < d; row += rows_per_chunk) {
    const int rows = std::min(rows_per_chunk, d - row);
    // Both the copy and the conversion run on the legacy default stream, so each chunk's conversion ends
    // before the next copy overwrites the staging buffer.
    check_cuda(cudaMemcpy2D(staging.data(), row_bytes, host_w + row * row_stride, row_stride * sizeof(float),
                            row_bytes, rows, cudaMemcpyHostToDevice),
               "weight upload");
    convert_to_bf16(m.buffer_.as<std::uint16_t>() + static_cast<std::size_t>(row) * k, staging.as<float>(),
                    static_cast<std::size_t>(rows) * k, StreamRef{});
  }
  check_cuda(cudaGetLastError(), "bf16 conversion");
  check_cuda(cudaStreamSynchronize(nullptr), "bf16 conversion");
  return m;
}

struct Blas::Impl {
  cublasHandle_t handle = nullptr;
  DeviceBuffer workspace;
  DeviceBuffer x_bf16;  // (max_rows, max_k) bf16 copy of x for bf16 weights
  BlasOptions options;
  ~Impl() {
    if (handle) cublasDestroy(handle);
  }
};

Blas::Blas(const BlasOptions& options) : impl_(std::make_unique<Impl>()) {
  SL_CHECK(options.max_rows > 0 && options.max_k >= 0);
  impl_->options = options;
  check_cublas(cublasCreate(&impl_->handle), "handle creation");
  impl_->workspace = DeviceBuffer(kWorkspaceBytes);
  check_cublas(cublasSetWorkspace(impl_->handle, impl_->workspace.data(), kWorkspaceBytes), "workspace");
  // Pointer mode host: alpha and beta are host constants, nothing to keep alive on the device.
  check_cublas(cublasSetPointerMode(impl_->handle, CUBLAS_POINTER_MODE_HOST), "pointer mode");
  // Default math: fp32 GEMMs stay fp32 (TF32 only with CUBLAS_TF32_TENSOR_OP_MATH, which we never set).
  check_cublas(cublasSetMathMode(impl_->handle, CUBLAS_DEFAULT_MATH), "math mode");
  impl_->x_bf16 = DeviceBuffer(static_cast<std::size_t>(options.max_rows) * options.max_k * sizeof(std::uint16_t));
}

Blas::Blas(Blas&&) noexcept = default;
Blas& Blas::operator=(Blas&&) noexcept = default;
Blas::~Blas() = default;

void Blas::matmul(float* y, const float* x, const DeviceMatrixView& w, int n, StreamRef stream) {
  if (n <= 0) return;
  Impl& m = *impl_;
  check_cublas(cublasSetStream(m.handle, native(stream)), "set stream");
  const float alpha = 1.0f;
  const float beta = 0.0f;
  const void* b = x;
  cudaDataType_t ab_type = CUDA_R_32F;
  if (w.dtype == DeviceDtype::kBf16) {
    SL_CHECK_MSG(n <= m.options.max_rows && w.k <= m.options.max_k,
                 "bf16 matmul of {} x {} exceeds the Blas' {} x {}", n, w.k, m.options.max_rows, m.options.max_k);
    convert_to_bf16(m.x_bf16.as<std::uint16_t>(), x, static_cast<std::size_t>(n) * w.k, stream);
    b = m.x_bf16.data();
    ab_type = CUDA_R_16BF;
  }
  check_cublas(cublasGemmEx(m.handle, CUBLAS_OP_T, CUBLAS_OP_N, w.d, n, w.k, &alpha, w.data, ab_type, w.k, b,
                            ab_type, w.k, &beta, y, CUDA_R_32F, w.d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "GEMM");
}

}  // namespace shardline::kernels::cuda
