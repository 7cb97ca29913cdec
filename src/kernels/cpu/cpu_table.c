/* The CPU backend's kernel table. */
#include "kernels/cpu/cpu.h"

const ch_kernels ch_cpu_kernel_table = {
    .name = "cpu",
    .gemm = ch_cpu_gemm,
    .conv2d_workspace = ch_cpu_conv2d_workspace,
    .conv2d_forward = ch_cpu_conv2d_forward,
    .conv2d_backward_data = ch_cpu_conv2d_backward_data,
    .conv2d_backward_weights = ch_cpu_conv2d_backward_weights,
    .maxpool2d_forward = ch_cpu_maxpool2d_forward,
    .maxpool2d_backward = ch_cpu_maxpool2d_backward,
    .avgpool2d_forward = ch_cpu_avgpool2d_forward,
    .avgpool2d_backward = ch_cpu_avgpool2d_backward,
    .upsample_forward = ch_cpu_upsample_forward,
    .upsample_backward = ch_cpu_upsample_backward,
    .batchnorm_stats = ch_cpu_batchnorm_stats,
    .batchnorm_finalize = ch_cpu_batchnorm_finalize,
    .channel_affine = ch_cpu_channel_affine,
    .batchnorm_backward_reduce = ch_cpu_batchnorm_backward_reduce,
    .batchnorm_backward_data = ch_cpu_batchnorm_backward_data,
    .relu_forward = ch_cpu_relu_forward,
    .relu_backward = ch_cpu_relu_backward,
    .add = ch_cpu_add,
    .act_forward = ch_cpu_act_forward,
    .act_backward = ch_cpu_act_backward,
    .bcast_forward = ch_cpu_bcast_forward,
    .bcast_backward = ch_cpu_bcast_backward,
    .copy_rows = ch_cpu_copy_rows,
    .dropout_mask = ch_cpu_dropout_mask,
    .to_real = ch_cpu_to_real,
    .col_sum = ch_cpu_col_sum,
    .optim_update = ch_cpu_optim_update,
    .softmax_xent = ch_cpu_softmax_xent,
    .mse = ch_cpu_mse,
};

const ch_kernels *ch_kernels_cpu(void) { return &ch_cpu_kernel_table; }
