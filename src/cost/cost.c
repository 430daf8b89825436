/*
 * cost.c - the cost model (cost.h): predicted seconds of every instruction
 * kind on a hardware profile. The planner prices its choices with these, the
 * simulator replays plans with them and the lower bound sums them, so the
 * three never disagree about what a transfer or an op costs.
 *
 * Ops, by the class of their descriptor (graph/ops.c):
 *   MATMUL     max(flops / (peak[weight dtype] * matmul_efficiency),
 *                  bytes / matvec_bw[weight dtype]) + launch_s
 *              (matvec_bw: the rate a few-row product streams its operands
 *              at through the backend's kernel, which a decode step's
 *              matrix-vector products run at; mem_bw where the profile has
 *              none)
 *              A block-quantized weight (q8_0, q4_0, q4_k, q5_k, q6_k): the
 *              GPU kernels dequantize tiles into bf16 and multiply those, so
 *              the FLOPs run at the profile's rate for the block type where
 *              it has one and at the bf16 rate otherwise; the bytes are the
 *              weight's quantized bytes (whole blocks, the tensor's nbytes)
 *              at matvec_bw of the block type, mem_bw where the profile has
 *              none. Assumed: dequantization costs no extra memory traffic
 *              and hides behind the loads (decode is bound by the bytes).
 *   ATTENTION  as MATMUL at the rate of its activation dtype, efficiency
 *              attention_efficiency (0.5 when the profile has none)
 *   GENERIC    as MATMUL at the f32 rate
 *   VECTOR     max(bytes / mem_bw, flops / (peak f32 * 0.5)) + launch_s
 * times op_scale[kind] where the profile has one (a refit's correction of
 * that kind, refit.c; 1 otherwise).
 * FLOPs and bytes come from the descriptor too: bytes are the distinct input
 * and output tensors' sizes, except for the gathers (EMBED, TAKE_LAST), which
 * touch only the rows they copy, and MATMUL tiles, which write only their
 * block.
 *
 * A COMPUTE placed on the host CPU runs at the profile's host rates
 * (host_flops, host_mem_bw) by the same classes, holding the host's compute,
 * so it overlaps the device's; a quantized MATMUL there reads its quantized
 * bytes at host_mem_bw (the CPU kernels dequantize in registers).
 *
 * Transfers: n / bandwidth + latency per stage; the SSD tier is striped over
 * ssd_count drives, so its bandwidth is ssd_count times one drive's. An SSD
 * <-> device transfer is two stages pipelined through chunks (the executor's
 * bounce buffer): the slower stage for all the bytes plus the faster one for
 * the first chunk. Where device memory is host memory (a host_addressable
 * plan) the drives read straight into the arena: an SSD LOAD is the read
 * alone.
 *
 * Collectives (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER over N ranks of B
 * bytes), ring algorithms over the profile's network. Inside one node (N <=
 * net_gpus_per_node, or a profile of one node), bandwidth bw = net_intra_bw
 * and latency a = net_intra_latency_s per step:
 *     reduce-scatter, all-gather   (N-1)/N * B / bw + (N-1) a
 *     all-reduce                   2 (N-1)/N * B / bw + 2 (N-1) a
 * Across nodes (G = net_gpus_per_node GPUs a node, M = ceil(N / G) nodes),
 * hierarchical: a reduce-scatter inside each node, then one between the
 * nodes over each GPU's 1/G part (every GPU its own link of net_inter_bw,
 * latency net_inter_latency_s):
 *     reduce-scatter   (G-1)/G * B / bw_intra + (G-1) a_intra
 *                      + (M-1)/M * (B/G) / bw_inter + (M-1) a_inter
 *     all-gather       the same, mirrored
 *     all-reduce       a reduce-scatter then an all-gather
 * One rank sends those bytes over each fabric: (N-1)/N * B (twice for an
 * all-reduce) inside one node; (G-1)/G * B inside and (M-1)/M * B/G between
 * nodes otherwise.
 */
#include "cost/cost.h"

#include "graph/graph.h"

/* Fraction of the matmul peak that attention reaches (softmax, masking and
 * small per-head tiles keep it well below large GEMMs). */
#define TIDE_ATTENTION_EFFICIENCY 0.5
/* Fraction of the f32 peak that element-wise and reduction ops reach. */
#define TIDE_VECTOR_EFFICIENCY 0.5

static double rate_of(const tide_hw *hw, tide_dtype dt) {
    double r = (unsigned)dt < TIDE_DTYPE_COUNT ? hw->flops[dt] : 0;
    /* a block type without a rate of its own: dequantized into bf16 tiles */
    if (!(r > 0) && tide_dtype_is_quantized(dt)) r = hw->flops[TIDE_BF16];
    return r > 0 ? r : hw->flops[TIDE_F32];
}

/* Bytes per second a MATMUL with weights of dtype dt streams at. */
static double matvec_bw_of(const tide_hw *hw, tide_dtype dt) {
    double bw = (unsigned)dt < TIDE_DTYPE_COUNT ? hw->matvec_bw[dt] : 0;
    return bw > 0 ? bw : hw->mem_bw;
}

/* One ring phase (a reduce-scatter or an all-gather) over n ranks of b
 * bytes at bandwidth bw, latency a a step; *sent += the bytes a rank sends. */
static double ring_phase(int n, double b, double bw, double a, double *sent) {
    if (n < 2) return 0;
    double f = (double)(n - 1) / n * b;
    *sent += f;
    return f / bw + (n - 1) * a;
}

double tide_cost_collective(const tide_hw *hw, int kind, uint64_t bytes, int ranks, double *intra, double *inter) {
    double in = 0, out = 0, b = (double)bytes, s = 0;
    int G = hw->net_gpus_per_node > 0 && hw->net_inter_bw > 0 ? hw->net_gpus_per_node : ranks;
    if (G > ranks) G = ranks;
    int M = (ranks + G - 1) / G;
    if (ranks >= 2 && hw->net_intra_bw > 0) {
        s = ring_phase(G, b, hw->net_intra_bw, hw->net_intra_latency_s, &in);
        if (M > 1) s += ring_phase(M, b / G, hw->net_inter_bw, hw->net_inter_latency_s, &out);
    } else if (ranks >= 2 && M > 1) { /* one GPU a node */
        s = ring_phase(M, b, hw->net_inter_bw, hw->net_inter_latency_s, &out);
    }
    if (kind == (int)TIDE_OP_ALL_REDUCE) s *= 2, in *= 2, out *= 2;
    if (intra) *intra = in;
    if (inter) *inter = out;
    return s;
}

const char *tide_hw_net_missing(const tide_hw *hw, int ranks) {
    if (ranks < 2) return NULL;
    int G = hw->net_gpus_per_node > 0 ? hw->net_gpus_per_node : ranks;
    if (G > 1 && !(hw->net_intra_bw > 0))
        return "it has no network between its GPUs (net_intra_bw, net_intra_latency_s)";
    if (ranks > G && !(hw->net_inter_bw > 0))
        return "its ranks would span nodes, but it has no network between nodes (net_inter_bw, "
               "net_inter_latency_s; net_gpus_per_node GPUs a node)";
    return NULL;
}

/* A collective op: the whole tensor's bytes over the network. */
static double collective_op_s(const tide_hw *hw, const tide_graph *g, const tide_op *op) {
    int full = op->kind == TIDE_OP_ALL_GATHER ? op->out[0] : op->in[0];
    return tide_cost_collective(hw, (int)op->kind, g->tensors[full].nbytes, op->p.ranks, NULL, NULL);
}

double tide_cost_op(const tide_hw *hw, const tide_graph *g, const tide_op *op) {
    if (tide_op_is_collective(op->kind)) return collective_op_s(hw, g, op);
    double bw = hw->mem_bw;
    const tide_op_desc *d = tide_op_desc_of(op->kind);
    double rate;
    switch (d ? d->cls : TIDE_OPC_VECTOR) {
    case TIDE_OPC_MATMUL: /* the weight's dtype */
        rate = rate_of(hw, g->tensors[op->in[1]].dtype) * hw->matmul_efficiency;
        bw = matvec_bw_of(hw, g->tensors[op->in[1]].dtype);
        break;
    case TIDE_OPC_ATTENTION: /* the activations' dtype */
        rate = rate_of(hw, g->tensors[op->in[0]].dtype) *
               (hw->attention_efficiency > 0 ? hw->attention_efficiency : TIDE_ATTENTION_EFFICIENCY);
        break;
    case TIDE_OPC_GENERIC:
        rate = hw->flops[TIDE_F32] * hw->matmul_efficiency;
        break;
    default:
        rate = hw->flops[TIDE_F32] * TIDE_VECTOR_EFFICIENCY;
        break;
    }
    double comp_s = op->flops > 0 ? op->flops / rate : 0, mem_s = tide_op_bytes(g, op) / bw;
    double scale = (unsigned)op->kind < TIDE_OP_COUNT && hw->op_scale[op->kind] > 0 ? hw->op_scale[op->kind] : 1;
    return ((comp_s > mem_s ? comp_s : mem_s) + hw->launch_s) * scale;
}

double tide_cost_op_host(const tide_hw *hw, const tide_graph *g, const tide_op *op) {
    double flops = hw->host_flops > 0 ? hw->host_flops : TIDE_HOST_FLOPS_DEFAULT;
    double bw = hw->host_mem_bw > 0 ? hw->host_mem_bw : TIDE_HOST_MEM_BW_DEFAULT;
    const tide_op_desc *d = tide_op_desc_of(op->kind);
    double rate = d && (d->cls == TIDE_OPC_MATMUL || d->cls == TIDE_OPC_GENERIC) ? flops
                : d && d->cls == TIDE_OPC_ATTENTION                         ? flops * TIDE_ATTENTION_EFFICIENCY
                                                                            : flops * TIDE_VECTOR_EFFICIENCY;
    double comp_s = op->flops > 0 ? op->flops / rate : 0, mem_s = tide_op_bytes(g, op) / bw;
    return comp_s > mem_s ? comp_s : mem_s;
}

double tide_hw_h2d_seconds(const tide_hw *hw, uint64_t n) {
    return (double)n / hw->h2d_bw + hw->link_latency_s;
}

double tide_hw_d2h_seconds(const tide_hw *hw, uint64_t n) {
    return (double)n / hw->d2h_bw + hw->link_latency_s;
}

double tide_hw_ssd_read_seconds(const tide_hw *hw, uint64_t n) {
    int k = hw->ssd_count > 0 ? hw->ssd_count : 1;
    return (double)n / (hw->ssd_read_bw * k) + hw->ssd_latency_s;
}

double tide_hw_ssd_write_seconds(const tide_hw *hw, uint64_t n) {
    int k = hw->ssd_count > 0 ? hw->ssd_count : 1;
    return (double)n / (hw->ssd_write_bw * k) + hw->ssd_latency_s;
}

/* Two stages of one transfer pipelined through chunks: the slower stage for
 * the whole, the faster for the first chunk. */
static double pipelined(double whole_a, double whole_b, double chunk_a, double chunk_b) {
    return (whole_a > whole_b ? whole_a : whole_b) + (chunk_a < chunk_b ? chunk_a : chunk_b);
}

static void set_res(unsigned *res, unsigned r) {
    if (res) *res = r;
}

double tide_cost_load(const tide_hw *hw, tide_tier src, uint64_t n, bool host_device, unsigned *res) {
    if (src != TIDE_TIER_SSD) {
        set_res(res, TIDE_RES_H2D);
        return tide_hw_h2d_seconds(hw, n);
    }
    if (host_device) {
        set_res(res, TIDE_RES_SSD);
        return tide_hw_ssd_read_seconds(hw, n);
    }
    uint64_t c = n < TIDE_COST_CHUNK ? n : TIDE_COST_CHUNK;
    set_res(res, TIDE_RES_SSD | TIDE_RES_H2D);
    return pipelined(tide_hw_ssd_read_seconds(hw, n), tide_hw_h2d_seconds(hw, n), tide_hw_ssd_read_seconds(hw, c),
                     tide_hw_h2d_seconds(hw, c));
}

double tide_cost_store(const tide_hw *hw, tide_tier dst, uint64_t n, unsigned *res) {
    if (dst != TIDE_TIER_SSD) {
        set_res(res, TIDE_RES_D2H);
        return tide_hw_d2h_seconds(hw, n);
    }
    uint64_t c = n < TIDE_COST_CHUNK ? n : TIDE_COST_CHUNK;
    set_res(res, TIDE_RES_D2H | TIDE_RES_SSD);
    return pipelined(tide_hw_d2h_seconds(hw, n), tide_hw_ssd_write_seconds(hw, n), tide_hw_d2h_seconds(hw, c),
                     tide_hw_ssd_write_seconds(hw, c));
}

double tide_cost_move(const tide_hw *hw, tide_tier dst, uint64_t n, unsigned *res) {
    set_res(res, TIDE_RES_SSD);
    return dst == TIDE_TIER_SSD ? tide_hw_ssd_write_seconds(hw, n) : tide_hw_ssd_read_seconds(hw, n);
}

double tide_cost_ins(const tide_hw *hw, const tide_graph *g, const tide_ins *in, bool host_device, unsigned *res) {
    uint64_t n = in->tensor >= 0 ? g->tensors[in->tensor].nbytes : 0;
    switch (in->kind) {
    case TIDE_INS_COMPUTE:
        if (in->place == TIDE_PLACE_HOST) {
            set_res(res, TIDE_RES_HOST);
            return tide_cost_op_host(hw, g, &g->ops[in->op]);
        }
        set_res(res, TIDE_RES_COMPUTE);
        return tide_cost_op(hw, g, &g->ops[in->op]);
    case TIDE_INS_LOAD: return tide_cost_load(hw, in->src, n, host_device, res);
    case TIDE_INS_STORE: return tide_cost_store(hw, in->dst, n, res);
    case TIDE_INS_MOVE: return tide_cost_move(hw, in->dst, n, res);
    case TIDE_INS_ALL_REDUCE:
    case TIDE_INS_REDUCE_SCATTER:
    case TIDE_INS_ALL_GATHER:
        set_res(res, TIDE_RES_NET);
        return collective_op_s(hw, g, &g->ops[in->op]);
    default:
        set_res(res, 0);
        return 0;
    }
}
