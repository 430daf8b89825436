/*
 * train_lora.c - LoRA training's pieces of the trainer (tide.h,
 * tide_llama_train_opts.lora_r): the adapters' initial values (PEFT's
 * initialisation, or an existing PEFT adapter), the frozen base bound to the
 * checkpoint, and the adapter written in PEFT's format (with its training
 * state, train_ckpt.c).
 *
 * Initialisation: A as torch's kaiming_uniform_(a = sqrt(5)), which PEFT
 * uses: uniform in [-1/sqrt(K), 1/sqrt(K)) for A (r, K); B zero, so the first
 * step starts from the base model's output. The uniform numbers come from
 * splitmix64 seeded by the trainer's seed xor the FNV-1a hash of the
 * tensor's name (so they do not depend on the graph's order or tiling): the
 * top 24 bits of each draw over 2^24. They are not torch's numbers; an
 * adapter that must match another run starts from it (lora_init).
 */
#include "train/trainer_int.h"
#include "model/st_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const char adapter_prefix[] = "base_model.model.";

bool train_is_adapter(const tide_trainer *t, int i) {
    const tide_tensor *T = &t->g->tensors[i];
    return t->o.step.lora_r > 0 && T->role == TIDE_ROLE_STATE &&
           strncmp(T->name, adapter_prefix, sizeof adapter_prefix - 1) == 0;
}

/* Whether field k of j is there and not null, {} or []. */
static bool nonempty(const cJSON *j, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    if (!v || cJSON_IsNull(v)) return false;
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) return cJSON_GetArraySize(v) > 0;
    return true;
}

tide_status tide_lora_read_config(tide_ctx *ctx, const char *dir, int *r, float *alpha, unsigned *targets) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/adapter_config.json", dir) >= (int)sizeof path)
        return tide_err(ctx, TIDE_E_INVALID, "'%s': path too long", dir);
    char *text = NULL;
    size_t len = 0;
    tide_status st = tide_read_text_file(ctx, path, (uint64_t)1 << 20, &text, &len);
    if (st) return st;
    cJSON *j = cJSON_ParseWithLength(text, len);
    tide_free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return tide_err(ctx, TIDE_E_FORMAT, "'%s' is not a JSON object", path);
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    const cJSON *jr = cJSON_GetObjectItemCaseSensitive(j, "r");
    const cJSON *ja = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    const cJSON *dora = cJSON_GetObjectItemCaseSensitive(j, "use_dora");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(j, "bias");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "use_rslora");
    if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA"))
        st = tide_err(ctx, TIDE_E_FORMAT, "'%s': peft_type must be \"LORA\"", path);
    else if (!cJSON_IsNumber(jr) || jr->valuedouble < 1 || jr->valuedouble > 65536 ||
             jr->valuedouble != (double)(int)jr->valuedouble)
        st = tide_err(ctx, TIDE_E_FORMAT, "'%s': r must be a positive integer", path);
    else if (!cJSON_IsNumber(ja) || !(ja->valuedouble > 0))
        st = tide_err(ctx, TIDE_E_FORMAT, "'%s': lora_alpha must be a positive number", path);
    else if (cJSON_IsTrue(dora) || cJSON_IsTrue(rs))
        st = tide_err(ctx, TIDE_E_FORMAT, "'%s': DoRA and rsLoRA adapters are not supported", path);
    else if (bias && !(cJSON_IsString(bias) && !strcmp(bias->valuestring, "none")))
        st = tide_err(ctx, TIDE_E_FORMAT, "'%s': bias must be \"none\"", path);
    else if (nonempty(j, "rank_pattern") || nonempty(j, "alpha_pattern") || nonempty(j, "layers_to_transform") ||
             nonempty(j, "modules_to_save"))
        st = tide_err(ctx, TIDE_E_FORMAT, "'%s': per-layer ranks or alphas, layers_to_transform and "
                      "modules_to_save are not supported", path);
    else if (!cJSON_IsArray(tm) || !cJSON_GetArraySize(tm))
        st = tide_err(ctx, TIDE_E_FORMAT, "'%s': target_modules must be a non-empty list of module names", path);
    unsigned bits = 0;
    for (const cJSON *e = st ? NULL : tm->child; e && !st; e = e->next) {
        unsigned b = 0;
        if (!cJSON_IsString(e) || tide_lora_parse_targets(ctx, e->valuestring, &b))
            st = tide_err(ctx, TIDE_E_FORMAT, "'%s': target module %s%s%s is not one of q_proj, k_proj, v_proj, "
                          "o_proj, gate_proj, up_proj, down_proj", path, cJSON_IsString(e) ? "'" : "",
                          cJSON_IsString(e) ? e->valuestring : "(not a string)", cJSON_IsString(e) ? "'" : "");
        bits |= b;
    }
    if (!st) {
        *r = (int)jr->valuedouble;
        *alpha = (float)ja->valuedouble;
        *targets = bits;
    }
    cJSON_Delete(j);
    return st;
}

tide_status train_lora_open(tide_trainer *t) {
    const tide_llama_train_opts *so = &t->o.step;
    const int r = so->lora_r;
    tide_status st;
    if (t->o.lora_init) {
        int ir;
        float ia;
        unsigned it;
        if ((st = tide_lora_read_config(t->ctx, t->o.lora_init, &ir, &ia, &it))) return st;
        const unsigned want = so->lora_targets ? so->lora_targets : TIDE_LORA_ALL;
        if (ir != r || ia != so->lora_alpha || it != want)
            return tide_err(t->ctx, TIDE_E_INVALID, "adapter '%s' has r %d, alpha %g and targets 0x%x; the step has "
                            "r %d, alpha %g and targets 0x%x", t->o.lora_init, ir, (double)ia, it, r,
                            (double)so->lora_alpha, want);
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/adapter_model.safetensors", t->o.lora_init) >= (int)sizeof path)
            return tide_err(t->ctx, TIDE_E_INVALID, "'%s': path too long", t->o.lora_init);
        tide_st_file *f = tide_calloc(1, sizeof *f);
        if (!f) return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory");
        f->fd = -1;
        if ((st = tide_st_open(t->ctx, path, f))) {
            tide_free(f);
            return st;
        }
        t->lora_init = f;
        /* every adapter must be there with its shape, f32 */
        for (int i = 0; i < t->g->n_tensors; i++) {
            if (!train_is_adapter(t, i)) continue;
            const tide_tensor *T = &t->g->tensors[i];
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(f->header, T->name);
            tide_st_tensor ti;
            if (!e) return tide_err(t->ctx, TIDE_E_FORMAT, "'%s' has no tensor '%s'", path, T->name);
            if ((st = tide_st_tensor_read(t->ctx, path, f, e, &ti))) return st;
            if (ti.dtype != TIDE_F32 || ti.ndim != 2 || ti.shape[0] != T->shape[0] || ti.shape[1] != T->shape[1])
                return tide_err(t->ctx, TIDE_E_FORMAT, "'%s': '%s' must be F32 (%lld, %lld)", path, T->name,
                                (long long)T->shape[0], (long long)T->shape[1]);
        }
    }
    if (!(t->lora_scale = tide_calloc((size_t)r * (size_t)r, sizeof *t->lora_scale)))
        return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory");
    const float sc = so->lora_alpha / (float)r;
    for (int i = 0; i < r; i++) t->lora_scale[(size_t)i * (size_t)r + (size_t)i] = sc;
    return TIDE_OK;
}

void train_lora_close(tide_trainer *t) {
    train_qlora_close(t);
    if (t->lora_init) {
        tide_st_close(t->lora_init);
        tide_free(t->lora_init);
        t->lora_init = NULL;
    }
    tide_free(t->lora_scale);
    t->lora_scale = NULL;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

tide_status train_lora_initial(tide_trainer *t, int i, void *buf) {
    const tide_tensor *T = &t->g->tensors[i];
    float *d = buf;
    const size_t n = (size_t)tide_tensor_numel(T);
    if (t->lora_init) {
        const tide_st_file *f = t->lora_init;
        tide_st_tensor ti;
        tide_status st = tide_st_tensor_read(t->ctx, "adapter", f,
                                             cJSON_GetObjectItemCaseSensitive(f->header, T->name), &ti);
        if (st) return st;
        memcpy(buf, f->map + ti.offset, T->nbytes);
        return TIDE_OK;
    }
    const char *lb = strstr(T->name, ".lora_B.");
    if (lb) {
        memset(buf, 0, T->nbytes);
        return TIDE_OK;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = T->name; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    uint64_t s = t->o.seed ^ h;
    const double bound = 1.0 / sqrt((double)T->shape[1]);
    for (size_t k = 0; k < n; k++) {
        double u = (double)(splitmix64(&s) >> 40) / 16777216.0;
        d[k] = (float)((2.0 * u - 1.0) * bound);
    }
    return TIDE_OK;
}

tide_status train_lora_bind(tide_trainer *t, tide_runner *run) {
    const tide_graph *rg = tide_runner_graph(run);
    tide_status st = TIDE_OK;
    for (int i = 0; !st && i < rg->n_tensors; i++) {
        if (rg->tensors[i].role != TIDE_ROLE_WEIGHT) continue;
        uint64_t off = 0, qn = 0;
        const char *home = tide_graph_tensor_home(rg, i, &off);
        const void *qd = train_qlora_data(t, home, &qn); /* QLoRA: a converted weight */
        if (qd && off + rg->tensors[i].nbytes > qn)
            return tide_err(t->ctx, TIDE_E_FORMAT, "'%s' runs past its weight '%s'", rg->tensors[i].name, home);
        if (qd) {
            st = tide_runner_bind_tensor(run, i, (char *)(uintptr_t)qd + off);
            continue;
        }
        tide_tensor_info ti;
        if (tide_checkpoint_get(t->ck, home, &ti))
            return tide_err(t->ctx, TIDE_E_FORMAT, "the checkpoint has no weight '%s'", home);
        if (off + rg->tensors[i].nbytes > ti.nbytes)
            return tide_err(t->ctx, TIDE_E_FORMAT, "'%s' runs past its checkpoint tensor '%s'", rg->tensors[i].name,
                            home);
        if (ti.data) st = tide_runner_bind_tensor(run, i, (char *)(uintptr_t)ti.data + off);
        else st = tide_runner_bind_file(run, i, ti.file, ti.file_offset + off);
    }
    if (!st) st = tide_runner_bind(run, "lora_scale", t->lora_scale);
    return st;
}

/* ---------------------------------------------------------------- saving */

const char *train_lora_base_name(const tide_trainer *t) {
    return t->o.lora_base_type ? t->o.lora_base_type : "as stored";
}

tide_status tide_trainer_save_lora(tide_trainer *t, const char *dir) {
    const tide_llama_train_opts *so = &t->o.step;
    if (so->lora_r <= 0) return tide_err(t->ctx, TIDE_E_INVALID, "this trainer trains no LoRA adapters");
    /* the config, as PEFT writes it (the fields PEFT's loader needs) */
    const unsigned bits = so->lora_targets ? so->lora_targets : TIDE_LORA_ALL;
    cJSON *j = cJSON_CreateObject(), *tm = cJSON_CreateArray();
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    cJSON_AddNumberToObject(j, "r", so->lora_r);
    cJSON_AddNumberToObject(j, "lora_alpha", (double)so->lora_alpha);
    cJSON_AddNumberToObject(j, "lora_dropout", 0);
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddBoolToObject(j, "fan_in_fan_out", false);
    cJSON_AddBoolToObject(j, "inference_mode", true);
    cJSON_AddBoolToObject(j, "use_rslora", false);
    cJSON_AddBoolToObject(j, "use_dora", false);
    cJSON_AddNullToObject(j, "base_model_name_or_path");
    for (int i = 0; i < TIDE_LORA_N; i++)
        if (bits & (1u << i)) cJSON_AddItemToArray(tm, cJSON_CreateString(tide_lora_target_name(i)));
    cJSON_AddItemToObject(j, "target_modules", tm);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory saving the adapter");
    size_t len = strlen(text);
    char *nl = tide_malloc(len + 2);
    if (!nl) {
        cJSON_free(text);
        return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory saving the adapter");
    }
    memcpy(nl, text, len);
    nl[len] = '\n';
    nl[len + 1] = '\0';
    cJSON_free(text);
    /* the adapter, its moments and the step, in one atomic directory */
    /* the base the adapter trained on (QLoRA's --base-type), checked by a resume */
    const char *extra[2] = {TIDE_LORA_BASE_KEY, train_lora_base_name(t)};
    tide_status st = train_save_state(t, dir, TIDE_F32, extra, 1, nl);
    tide_free(nl);
    return st;
}
