/*
 * model_ext.c - the model's narrow door for the library's own clients
 * (model_ext.h); the rest of it is in place.c (gen_runs, set_hw).
 */
#include "runtime/model_int.h"

const tide_hw *tide_model_hw(const tide_model *m) { return m ? &m->hw : NULL; }
