/*
 * api_hw.c - hardware profiles and probing in tide.h: the public tide_hw is
 * the cost model's profile (cost/cost.h), held here on the heap; loading,
 * saving and listing are cost/hw.c's, measuring is probe/probe_backend.c's.
 */
#include "probe/probe.h"

#include <string.h>

tide_status tide_hw_open(tide_ctx *ctx, const char *name_or_path, tide_hw **out) {
    if (!out) return tide_err(ctx, TIDE_E_INVALID, "tide_hw_open: nowhere for the profile");
    *out = NULL;
    tide_hw *hw = tide_calloc(1, sizeof *hw);
    if (!hw) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    tide_status st = tide_hw_load(ctx, name_or_path, hw);
    if (st) {
        tide_free(hw);
        return st;
    }
    *out = hw;
    return TIDE_OK;
}

void tide_hw_free(tide_hw *hw) { tide_free(hw); }

void tide_hw_info_get(const tide_hw *hw, tide_hw_info *out) {
    *out = (tide_hw_info){
        .name = hw->name, .device_mem_bytes = hw->device_mem_bytes, .host_mem_bytes = hw->host_mem_bytes,
        .flops_f32 = hw->flops[TIDE_F32], .flops_f16 = hw->flops[TIDE_F16], .flops_bf16 = hw->flops[TIDE_BF16],
        .matmul_efficiency = hw->matmul_efficiency, .mem_bw = hw->mem_bw, .h2d_bw = hw->h2d_bw,
        .d2h_bw = hw->d2h_bw, .ssd_count = hw->ssd_count, .ssd_read_bw = hw->ssd_read_bw,
        .ssd_write_bw = hw->ssd_write_bw, .source = hw->source,
        .host_flops = hw->host_flops > 0 ? hw->host_flops : TIDE_HOST_FLOPS_DEFAULT,
        .host_mem_bw = hw->host_mem_bw > 0 ? hw->host_mem_bw : TIDE_HOST_MEM_BW_DEFAULT,
        .net_intra_bw = hw->net_intra_bw, .net_inter_bw = hw->net_inter_bw,
        .net_gpus_per_node = hw->net_gpus_per_node,
    };
}

tide_hw_probe_opts tide_hw_probe_opts_default(void) { return (tide_hw_probe_opts){.seconds = 10}; }

tide_status tide_hw_probe(tide_ctx *ctx, tide_backend *be, const tide_hw_probe_opts *o, tide_hw **out) {
    if (!be || !out) return tide_err(ctx, TIDE_E_INVALID, "tide_hw_probe: a backend and somewhere for the profile "
                                     "are required");
    *out = NULL;
    tide_hw_probe_opts d = tide_hw_probe_opts_default();
    if (!o) o = &d;
    tide_hw *hw = tide_calloc(1, sizeof *hw);
    if (!hw) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    tide_status st = tide_probe_backend(ctx, be, o->ssd_dirs, o->seconds, o->base, hw);
    if (st) {
        tide_free(hw);
        return st;
    }
    *out = hw;
    return TIDE_OK;
}
