/*
 * test_quant_mix.c - tide_quant_mix_apply (src/model/quant_mix.c) gives each
 * weight the type llama.cpp's quantizer gives it (docs/quantization.md): the
 * base type, the output head in Q6_K (Q8_0 under a Q8_0 mix, or when its rows
 * are not whole 256-blocks), the tied embedding as the head, attn_v and
 * ffn_down in Q6_K on the use_more_bits layers of the _M mixes (listed here
 * for 22 and 32 layers as llama.cpp's rule selects them), attn_v in Q5_K for
 * an 80-layer Q4_K_M model, norms f32, the row fallbacks, and the errors.
 */
#include "tide.h"

#include "model/quant_mix.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static tide_llama_config base_config(int layers, int hidden, int inter, bool tied) {
    tide_llama_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "mixtest");
    c.hidden_size = hidden;
    c.intermediate_size = inter;
    c.num_hidden_layers = layers;
    c.num_attention_heads = hidden / 64 > 0 ? hidden / 64 : 1;
    c.num_key_value_heads = c.num_attention_heads;
    c.vocab_size = 512;
    c.max_position_embeddings = 128;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.f;
    c.tie_word_embeddings = tied;
    c.dtype = TIDE_BF16;
    return c;
}

static void test_q4_k_m_rules(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    /* TinyLlama's shape: 22 layers, n/8 = 2, 7n/8 = 19: layers 0, 1, 19, 20,
     * 21 and (i - 2) % 3 == 2: 4, 7, 10, 13, 16 */
    tide_llama_config c = base_config(22, 2048, 5632, false);
    assert_int_equal(tide_quant_mix_apply(ctx, "q4_k_m", &c), TIDE_OK);
    assert_true(c.wtypes_set);
    assert_int_equal(c.dtype, TIDE_Q4_K);
    assert_int_equal(c.wtypes.head, TIDE_Q6_K);
    assert_int_equal(c.wtypes.embed, TIDE_Q4_K);
    assert_int_equal(c.wtypes.norm, TIDE_F32);
    const int more[] = {0, 1, 4, 7, 10, 13, 16, 19, 20, 21};
    for (int L = 0; L < 22; L++) {
        bool m = false;
        for (size_t k = 0; k < sizeof more / sizeof more[0]; k++) m = m || more[k] == L;
        assert_int_equal(tide_quant_use_more_bits(L, 22), m);
        assert_int_equal(c.wtypes.layer[L][TIDE_W_V], m ? TIDE_Q6_K : TIDE_Q4_K);
        assert_int_equal(c.wtypes.layer[L][TIDE_W_DOWN], m ? TIDE_Q6_K : TIDE_Q4_K);
        assert_int_equal(c.wtypes.layer[L][TIDE_W_Q], TIDE_Q4_K);
        assert_int_equal(c.wtypes.layer[L][TIDE_W_K], TIDE_Q4_K);
        assert_int_equal(c.wtypes.layer[L][TIDE_W_O], TIDE_Q4_K);
        assert_int_equal(c.wtypes.layer[L][TIDE_W_GATE], TIDE_Q4_K);
        assert_int_equal(c.wtypes.layer[L][TIDE_W_UP], TIDE_Q4_K);
    }
    assert_int_equal(tide_llama_weight_dtype(&c, "model.layers.4.self_attn.v_proj.weight"), TIDE_Q6_K);
    assert_int_equal(tide_llama_weight_dtype(&c, "model.layers.5.mlp.down_proj.weight"), TIDE_Q4_K);
    assert_int_equal(tide_llama_weight_dtype(&c, "model.layers.5.input_layernorm.weight"), TIDE_F32);
    assert_int_equal(tide_llama_config_check(ctx, &c), TIDE_OK);
    /* 32 layers: n/8 = 4, 7n/8 = 28: 0-3, 28-31, and 6, 9, ..., 27 */
    for (int L = 0; L < 32; L++) {
        bool m = L < 4 || L >= 28 || (L - 4) % 3 == 2;
        assert_int_equal(tide_quant_use_more_bits(L, 32), m);
    }
    /* Q5_K_M: the same rules over Q5_K */
    c = base_config(32, 4096, 11008, false);
    assert_int_equal(tide_quant_mix_apply(ctx, "Q5_K_M", &c), TIDE_OK);
    assert_int_equal(c.wtypes.layer[6][TIDE_W_V], TIDE_Q6_K);
    assert_int_equal(c.wtypes.layer[7][TIDE_W_V], TIDE_Q5_K);
    assert_int_equal(c.wtypes.layer[7][TIDE_W_DOWN], TIDE_Q5_K);
    assert_int_equal(c.wtypes.embed, TIDE_Q5_K);
    assert_int_equal(c.wtypes.head, TIDE_Q6_K);
    /* an 80-layer model: attn_v Q5_K where Q4_K_M left Q4_K */
    c = base_config(80, 8192, 28672, false);
    assert_int_equal(tide_quant_mix_apply(ctx, "Q4_K_M", &c), TIDE_OK);
    assert_int_equal(c.wtypes.layer[10][TIDE_W_V], TIDE_Q5_K);
    assert_int_equal(c.wtypes.layer[11][TIDE_W_V], TIDE_Q5_K);
    assert_int_equal(c.wtypes.layer[12][TIDE_W_V], TIDE_Q6_K); /* (12 - 10) % 3 == 2 */
    assert_int_equal(c.wtypes.layer[11][TIDE_W_DOWN], TIDE_Q4_K);
    tide_ctx_free(ctx);
}

static void test_plain_mixes_and_fallbacks(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_llama_config c = base_config(4, 2048, 5632, true);
    assert_int_equal(tide_quant_mix_apply(ctx, "q8_0", &c), TIDE_OK);
    assert_int_equal(c.wtypes.head, TIDE_Q8_0);
    assert_int_equal(c.wtypes.embed, TIDE_Q8_0);
    assert_int_equal(c.wtypes.layer[0][TIDE_W_V], TIDE_Q8_0);
    c = base_config(4, 2048, 5632, true);
    assert_int_equal(tide_quant_mix_apply(ctx, "q4_0", &c), TIDE_OK);
    assert_int_equal(c.wtypes.embed, TIDE_Q6_K); /* tied: the embedding is the output */
    assert_int_equal(c.wtypes.layer[0][TIDE_W_DOWN], TIDE_Q4_0);
    c = base_config(4, 2048, 5632, false);
    assert_int_equal(tide_quant_mix_apply(ctx, "q6_k", &c), TIDE_OK);
    for (int r = 0; r < TIDE_W_LAYER_ROLES; r++) assert_int_equal(c.wtypes.layer[3][r], TIDE_Q6_K);
    assert_int_equal(c.wtypes.embed, TIDE_Q6_K);
    /* rows of 64 (not whole 256-blocks): the head Q8_0, Q4_K rows Q8_0 (llama.cpp: Q5_0), Q6_K rows Q8_0 */
    c = base_config(2, 64, 160, false);
    assert_int_equal(tide_quant_mix_apply(ctx, "Q4_K_M", &c), TIDE_OK);
    assert_int_equal(c.wtypes.head, TIDE_Q8_0);
    assert_int_equal(c.wtypes.embed, TIDE_Q8_0);
    assert_int_equal(c.wtypes.layer[0][TIDE_W_Q], TIDE_Q8_0);
    assert_int_equal(c.wtypes.layer[0][TIDE_W_DOWN], TIDE_Q8_0); /* 160 = 5 x 32 */
    tide_dtype rule;
    const tide_quant_mix *m = tide_quant_mix_find("q5_k_m");
    assert_non_null(m);
    assert_int_equal(tide_quant_mix_type(m, TIDE_W_Q, 1, 8, 96, &rule), TIDE_Q8_0);
    assert_int_equal(rule, TIDE_Q5_K);
    assert_int_equal(tide_quant_mix_type(m, TIDE_W_Q, 1, 8, 80, &rule), TIDE_F16); /* not whole 32-blocks */
    assert_int_equal(tide_quant_mix_type(m, TIDE_W_Q, 1, 8, 512, &rule), TIDE_Q5_K);
    assert_int_equal(m->ftype, 17);
    assert_int_equal(tide_quant_mix_find("Q4_K_M")->ftype, 15);
    assert_int_equal(tide_quant_mix_find("Q8_0")->ftype, 7);
    assert_int_equal(tide_quant_mix_find("Q4_0")->ftype, 2);
    assert_int_equal(tide_quant_mix_find("Q6_K")->ftype, 18);
    /* errors: unknown mix (the message lists the known ones), 48-element rows under Q4_0 */
    assert_int_equal(tide_quant_mix_apply(ctx, "q3_k_m", &c), TIDE_E_NOT_FOUND);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "Q4_K_M"));
    c = base_config(2, 48, 96, false);
    c.num_attention_heads = c.num_key_value_heads = 3;
    assert_int_equal(tide_quant_mix_apply(ctx, "q4_0", &c), TIDE_E_UNSUPPORTED);
    assert_false(c.wtypes_set);
    const char *const *names = tide_quant_mix_names();
    int n = 0;
    while (names[n]) assert_non_null(tide_quant_mix_find(names[n++]));
    assert_int_equal(n, 5);
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q4_k_m_rules),
        cmocka_unit_test(test_plain_mixes_and_fallbacks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
