/* A graph made into a model, and an imported graph's starting values into it: the graph's side of
 * nn/model.h, so that nn/ knows nothing of graphs (the dependency runs graph -> nn only). */
#include "graph/graph.h"

#include "nn/model.h"

ch_status ch_model_create_graph(const ch_graph *g, ch_shape3 input, int classes,
                                const ch_backend *be, ch_model **out, ch_err *err)
{
    ch_layer *root;
    CH_TRY(ch_graph_compile(g, &root, err));
    const ch_shape3 in = root->in;
    const size_t logits = ch_shape3_size(root->out);
    if (in.c != input.c || in.h != input.h || in.w != input.w || logits != (size_t)classes) {
        ch_status st = ch_fail(err, CH_STATUS_BAD_INPUT, "graph %s takes %dx%dx%d inputs to %zu logits; "
                               "the data are %dx%dx%d in %d classes", ch_graph_name(g), in.c, in.h,
                               in.w, logits, input.c, input.h, input.w, classes);
        ch_layer_free(root);
        return st;
    }
    return ch_model_create_from(ch_graph_name(g), root, classes, be, out, err);
}

ch_status ch_model_load_initial(ch_model *m, const ch_graph *g, ch_err *err)
{
    int values = 0; /* the model's parameters and buffers, each to be set once */
    for (int i = 0; i < m->ntensors; i++) values += m->tensors[i].kind != CH_TENSOR_COUNTER;
    for (int i = 0; i < g->ninits; i++) {
        const ch_ginit *v = &g->inits[i];
        const ch_tensor_ref *t = ch_model_find(m, v->name);
        if (!t || t->kind == CH_TENSOR_COUNTER)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: the file's tensor '%s' is no parameter or buffer of the "
                           "model", m->arch, v->name);
        if (t->spec->count != v->count)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: the file's tensor '%s' has %zu values, the model's %zu",
                           m->arch, v->name, v->count, t->spec->count);
        CH_TRY(ch_model_write_tensor(m, t, v->data, err));
    }
    /* The graph's names are distinct, so each matched a different tensor: any left over has no
     * value in the file, and a model half random is never meant. */
    if (g->ninits != values)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: the file gives %d of the model's %d parameters and buffers",
                       m->arch, g->ninits, values);
    return CH_STATUS_OK;
}
