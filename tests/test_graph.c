/* The graph builder's refusals (each names the node and what is wrong; the first error sticks),
 * the compiled graph's checks, the gradient memory plan and the fingerprint. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/graph.h"
#include "graph/graph_json.h"
#include "graph_models.h"
#include "nn/model.h"

static ch_graph *fresh(void)
{
    ch_graph *g;
    ch_err err;
    assert_int_equal(ch_graph_create("t", &g, &err), CH_STATUS_OK);
    return g;
}

/* g's first error contains want; g is freed. */
static void expect_error(ch_graph *g, const char *want)
{
    ch_err err = { 0 };
    assert_int_equal(ch_graph_status(g, &err), CH_STATUS_BAD_INPUT);
    if (!strstr(err.msg, want)) fail_msg("expected '%s' in '%s'", want, err.msg);
    assert_null(strchr(err.msg, '\n'));
    ch_graph_free(g);
}

static const ch_conv2d_args conv8 = { .out_channels = 8, .kernel = 3, .padding = 1 };

static void builder_refusals(void **state)
{
    (void)state;
    ch_graph *g = fresh();
    int x = ch_graph_input(g, "x", 1, 8, 8);
    ch_graph_conv2d(g, "conv", x, &conv8);
    assert_int_equal(ch_graph_conv2d(g, "conv", x, &conv8), -1);
    expect_error(g, "two nodes are named 'conv'");

    g = fresh();
    x = ch_graph_input(g, "x", 1, 8, 8);
    ch_graph_relu(g, "a b", x);
    expect_error(g, "node name 'a b'");

    g = fresh();
    x = ch_graph_input(g, "x", 1, 8, 8);
    ch_graph_conv2d(g, "big", x, &(ch_conv2d_args){ .out_channels = 4, .kernel = 11 });
    expect_error(g, "node 'big' (conv2d): conv big: kernel 11");

    g = fresh();
    x = ch_graph_input(g, "x", 3, 8, 8);
    ch_graph_conv2d(g, "dw", x, &(ch_conv2d_args){ .out_channels = 4, .kernel = 3, .groups = 3 });
    expect_error(g, "node 'dw' (conv2d)");

    g = fresh();
    x = ch_graph_input(g, "x", 1, 8, 8);
    ch_graph_linear(g, "fc", x, 10, true);
    expect_error(g, "node 'fc' (linear): input 1x8x8 is not flat");

    g = fresh();
    ch_graph_input(g, "x", 1, 8, 8);
    ch_graph_relu(g, "r", 99);
    expect_error(g, "input 0 is tensor 99, which does not exist");

    g = fresh();
    x = ch_graph_input(g, "x", 1, 8, 8);
    int a = ch_graph_conv2d(g, "a", x, &conv8);
    int b = ch_graph_conv2d(g, "b", x, &(ch_conv2d_args){ .out_channels = 4, .kernel = 3, .padding = 1 });
    ch_graph_add(g, "sum", a, b);
    expect_error(g, "node 'sum' (add): add sum: shapes 8x8x8 and 4x8x8 do not broadcast");

    g = fresh();
    x = ch_graph_input(g, "x", 1, 8, 8);
    a = ch_graph_conv2d(g, "a", x, &conv8);
    b = ch_graph_max_pool2d(g, "p", x, &(ch_pool2d_args){ .kernel = 2 });
    ch_graph_concat(g, "cat", (const int[]){ a, b }, 2);
    expect_error(g, "node 'cat' (concat): concat cat: input 1 is 4x4, input 0 8x8");

    g = fresh();
    x = ch_graph_input(g, "x", 1, 8, 8);
    assert_int_equal(ch_graph_output(g, ch_graph_conv2d(g, "c", x, &conv8)), CH_STATUS_BAD_INPUT);
    expect_error(g, "the output of node 'c' is 8x8x8, not a vector of logits");

    g = fresh();
    assert_int_equal(ch_graph_input(g, "x", 1, 1 << 20, 8), -1);
    expect_error(g, "input 'x': shape 1x1048576x8");

    g = fresh();
    x = ch_graph_input(g, "x", 1, 8, 8);
    ch_graph_dropout(g, "d", x, 1.0);
    expect_error(g, "node 'd' (dropout): p 1 is not in 0..0.999999");

    g = fresh();
    x = ch_graph_input(g, "x", 1, 8, 8);
    ch_graph_clip(g, "clip", x, 6, 0);
    expect_error(g, "clip clip: min 6 above max 0");
}

/* The first error is kept; the calls after it do nothing. */
static void first_error_sticks(void **state)
{
    (void)state;
    ch_graph *g = fresh();
    int x = ch_graph_input(g, "x", 1, 8, 8);
    assert_int_equal(ch_graph_conv2d(g, "bad", x, &(ch_conv2d_args){ .out_channels = 0, .kernel = 3 }), -1);
    assert_int_equal(ch_graph_relu(g, "r", x), -1);
    assert_int_equal(ch_graph_node_count(g), 0);
    assert_int_equal(ch_graph_output(g, x), CH_STATUS_BAD_INPUT);
    expect_error(g, "node 'bad' (conv2d)");
}

static ch_graph *small_net(int extra_relus)
{
    ch_graph *g = fresh();
    int x = ch_graph_input(g, "x", 2, 6, 6);
    x = ch_graph_conv2d(g, "conv", x, &conv8);
    for (int i = 0; i < extra_relus; i++) {
        char name[16];
        snprintf(name, sizeof name, "act%d", i);
        x = ch_graph_leaky_relu(g, name, x, 0.1);
    }
    x = ch_graph_flatten(g, "flatten", x);
    ch_graph_output(g, ch_graph_linear(g, "fc", x, 10, true));
    return g;
}

static void compile_checks(void **state)
{
    (void)state;
    ch_err err;
    ch_layer *root;
    ch_graph *g = fresh();
    int x = ch_graph_input(g, "x", 1, 8, 8);
    ch_graph_relu(g, "unused", x);
    int y = ch_graph_flatten(g, "flatten", x);
    ch_graph_output(g, ch_graph_linear(g, "fc", y, 10, true));
    assert_int_equal(ch_graph_compile(g, &root, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "the output of node 'unused' (relu) is never used"));
    ch_graph_free(g);

    g = fresh();
    ch_graph_input(g, "x", 1, 8, 8);
    assert_int_equal(ch_graph_compile(g, &root, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "no output marked"));
    ch_graph_free(g);

    /* The data must be what the graph takes. */
    g = small_net(0);
    ch_model *m;
    assert_int_equal(ch_model_create_graph(g, (ch_shape3){ 1, 6, 6 }, 10, ch_backend_host(), &m, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "graph t takes 2x6x6 inputs to 10 logits; the data are 1x6x6 in 10 classes"));
    assert_int_equal(ch_model_create_graph(g, (ch_shape3){ 2, 6, 6 }, 10, ch_backend_host(), &m, &err), CH_STATUS_OK);
    assert_non_null(ch_model_find(m, "conv.weight"));
    assert_non_null(ch_model_find(m, "fc.bias"));
    assert_int_equal(m->ntensors, 4);
    ch_model_free(m);
    ch_graph_free(g);
}

/* Gradients of a chain live one step each: a long chain plans two blocks, not one per tensor. */
static void gradient_blocks_are_reused(void **state)
{
    (void)state;
    ch_err err;
    ch_graph *g = small_net(12);
    ch_model *m;
    assert_int_equal(ch_model_create_graph(g, (ch_shape3){ 2, 6, 6 }, 10, ch_backend_host(), &m, &err), CH_STATUS_OK);
    assert_int_equal(ch_model_plan(m, 4, 1, &err), CH_STATUS_OK);
    const size_t act = 8 * 6 * 6 * 4;   /* one activation gradient of the batch */
    print_message("chain of 14 nodes: %zu elements of gradient blocks (%zu per tensor)\n", m->root->scratch_own, act);
    assert_true(m->root->scratch_own <= 2 * act + 288 * 4);
    ch_model_free(m);
    ch_graph_free(g);
}

/* A ReLU is fused into the convolution before it only when it is the convolution's one reader:
 * here the convolution's own output is concatenated too and must keep its negative values. */
static void relu_fusion_only_for_the_one_reader(void **state)
{
    (void)state;
    ch_err err;
    ch_graph *g = fresh();
    int x = ch_graph_input(g, "x", 1, 5, 5);
    int c = ch_graph_conv2d(g, "c", x, &(ch_conv2d_args){ .out_channels = 2, .kernel = 3, .padding = 1 });
    int r = ch_graph_relu(g, "r", c);
    int cat = ch_graph_concat(g, "cat", (const int[]){ r, c }, 2);
    cat = ch_graph_flatten(g, "flatten", cat);
    ch_graph_output(g, ch_graph_linear(g, "fc", cat, 3, true));
    ch_model *m;
    assert_int_equal(ch_model_create_graph(g, (ch_shape3){ 1, 5, 5 }, 3, ch_backend_host(), &m, &err), CH_STATUS_OK);
    assert_int_equal(ch_model_init_params(m, "default", 1, &err), CH_STATUS_OK);
    assert_int_equal(ch_model_plan(m, 2, 1, &err), CH_STATUS_OK);
    ch_real xs[50];
    tu_fill_uniform(xs, 50, -1, 1, 5);
    ch_run run = ch_model_run(m, true);
    ch_model_forward(m, &run, 2, xs);
    const ch_layer *catl = m->root->children[2];
    assert_string_equal(catl->name, "cat");
    int negative = 0, relu_negative = 0;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 50; i++) {
            const ch_real v = catl->y[s * 100 + i], u = catl->y[s * 100 + 50 + i];
            relu_negative += v < 0;
            negative += u < 0;
        }
    assert_int_equal(relu_negative, 0);
    assert_true(negative > 0);
    ch_model_free(m);
    ch_graph_free(g);
}

/* Broadcasting aligns shapes from the right, as PyTorch: a (3) vector against (3, 3, 3) runs along
 * the last dimension, and a (3, 1, 1) tensor along the channels. */
static void broadcasting_follows_pytorch(void **state)
{
    (void)state;
    ch_err err;
    ch_graph *g = fresh();
    int x = ch_graph_input(g, "x", 3, 3, 3);
    int v = ch_graph_mean_hw(g, "v", x, false);
    int k = ch_graph_mean_hw(g, "k", x, true);
    int a = ch_graph_mul(g, "a", x, v);
    a = ch_graph_mul(g, "a2", v, a);               /* the vector first, too */
    int b = ch_graph_add(g, "b", k, a);
    b = ch_graph_flatten(g, "flatten", b);
    ch_graph_output(g, ch_graph_linear(g, "fc", b, 2, true));
    ch_model *m;
    assert_int_equal(ch_model_create_graph(g, (ch_shape3){ 3, 3, 3 }, 2, ch_backend_host(), &m, &err), CH_STATUS_OK);
    assert_int_equal(ch_model_plan(m, 2, 1, &err), CH_STATUS_OK);
    ch_real xs[54];
    tu_fill_uniform(xs, 54, -1, 1, 9);
    ch_run run = ch_model_run(m, false);
    ch_model_forward(m, &run, 2, xs);
    const ch_real *out = m->root->children[4]->y;   /* b = k + v * (x * v) */
    assert_string_equal(m->root->children[4]->name, "b");
    for (int s = 0; s < 2; s++)
        for (int c = 0; c < 3; c++)
            for (int h = 0; h < 3; h++)
                for (int w = 0; w < 3; w++) {
                    const ch_real *xs_ = xs + s * 27;
                    double mc = 0, mw = 0;
                    for (int i = 0; i < 9; i++) {
                        mc += xs_[c * 9 + i];
                        mw += xs_[w * 9 + i];
                    }
                    const double want = mc / 9 + xs_[c * 9 + h * 3 + w] * (mw / 9) * (mw / 9);
                    assert_true(fabs(out[s * 27 + c * 9 + h * 3 + w] - want) < 1e-5);
                }
    ch_model_free(m);
    ch_graph_free(g);
}

/* Node b is node a: op, name, edges and every argument, compared field by field (not through
 * the JSON, which would hide a field that is never written). Defaults spelled 0 by a builder
 * call and written as their value (stride 1) are the same setting. */
static void assert_same_node(const ch_gnode *a, const ch_gnode *b)
{
    assert_string_equal(a->name, b->name);
    assert_int_equal(a->op, b->op);
    assert_int_equal(a->nin, b->nin);
    for (int j = 0; j < a->nin; j++) assert_int_equal(a->in[j], b->in[j]);
    assert_int_equal(a->out, b->out);
    const ch_conv2d_args *c = &a->conv, *d = &b->conv;
    if (a->op == CH_GOP_CONV2D) {
        assert_int_equal(c->out_channels, d->out_channels);
        assert_int_equal(c->kernel, d->kernel);
        assert_int_equal(c->stride ? c->stride : 1, d->stride);
        assert_int_equal(c->padding, d->padding);
        assert_int_equal(c->dilation ? c->dilation : 1, d->dilation);
        assert_int_equal(c->groups ? c->groups : 1, d->groups);
        assert_int_equal(c->no_bias, d->no_bias);
    }
    if (a->op == CH_GOP_MAX_POOL2D || a->op == CH_GOP_AVG_POOL2D) {
        assert_int_equal(a->pool.kernel, b->pool.kernel);
        assert_int_equal(a->pool.stride ? a->pool.stride : a->pool.kernel, b->pool.stride);
        assert_int_equal(a->pool.padding, b->pool.padding);
        assert_int_equal(a->pool.ceil_mode, b->pool.ceil_mode);
        assert_int_equal(a->pool.exclude_pad, b->pool.exclude_pad);
    }
    assert_true(memcmp(&a->act, &b->act, sizeof a->act) == 0);
    assert_true(a->bn.eps == b->bn.eps && a->bn.momentum == b->bn.momentum && a->p == b->p);
    assert_int_equal(a->features, b->features);
    assert_int_equal(a->bias, b->bias);
    assert_int_equal(a->keepdim, b->keepdim);
    assert_memory_equal(a->view, b->view, sizeof a->view);
}

/* Every op and argument survives graph.json: the five parity models (which use them all, with
 * dropout) read back to the same nodes, and to the same JSON. */
static void json_keeps_every_op(void **state)
{
    (void)state;
    static const char *const models[] = { "resnet", "mobilenet", "densenet", "lognet", "headnet" };
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        ch_err err;
        ch_graph *g, *back;
        assert_int_equal(tg_build(models[i], 0.25, &g, &err), CH_STATUS_OK);
        char *text = ch_graph_to_json(g), *again;
        assert_non_null(text);
        assert_int_equal(ch_graph_from_json(text, strlen(text), models[i], &back, &err), CH_STATUS_OK);
        assert_non_null(again = ch_graph_to_json(back));
        assert_string_equal(text, again);
        assert_int_equal(back->nnodes, g->nnodes);
        for (int k = 0; k < g->nnodes; k++) assert_same_node(&g->nodes[k], &back->nodes[k]);
        free(text);
        free(again);
        ch_graph_free(g);
        ch_graph_free(back);
    }
}

/* GELU's two forms, erf and nearest upsampling survive graph.json as what they are; an unknown
 * GELU form is refused. */
static void json_keeps_gelu_forms(void **state)
{
    (void)state;
    ch_err err;
    ch_graph *g, *back;
    assert_int_equal(ch_graph_create("gelu", &g, &err), CH_STATUS_OK);
    int x = ch_graph_input(g, "x", 2, 3, 3);
    x = ch_graph_gelu(g, "exact", x, false);
    x = ch_graph_gelu(g, "approx", x, true);
    x = ch_graph_erf(g, "erf", x);
    x = ch_graph_upsample_nearest(g, "up", x, 2, 3);
    assert_int_equal(ch_graph_shape(g, x).h, 6);
    assert_int_equal(ch_graph_shape(g, x).w, 9);
    ch_graph_output(g, ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", x), 3, true));
    char *text = ch_graph_to_json(g), *again;
    assert_non_null(text);
    assert_non_null(strstr(text, "\"tanh\""));
    assert_int_equal(ch_graph_from_json(text, strlen(text), "gelu", &back, &err), CH_STATUS_OK);
    assert_non_null(again = ch_graph_to_json(back));
    assert_string_equal(text, again);
    const ch_act_kind kinds[3] = { CH_ACT_GELU, CH_ACT_GELU_TANH, CH_ACT_ERF };
    for (int k = 0; k < 3; k++) assert_int_equal(back->nodes[k].act.kind, kinds[k]);
    assert_int_equal(back->nodes[3].op, CH_GOP_UPSAMPLE);
    assert_int_equal(back->nodes[3].scale[0], 2);
    assert_int_equal(back->nodes[3].scale[1], 3);
    char *bad = malloc(strlen(text) + 8), *at = strstr(text, "\"tanh\"");
    sprintf(bad, "%.*s\"tanhh\"%s", (int)(at - text), text, at + 6);
    ch_graph *refused = NULL;
    assert_int_equal(ch_graph_from_json(bad, strlen(bad), "gelu", &refused, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "'approximate' is not \"none\" or \"tanh\""));
    free(bad), free(text), free(again);
    ch_graph_free(g);
    ch_graph_free(back);
}

/* The channel shuffle and slice, LayerNorm's forms, a transposed convolution and a bilinear resize survive a graph.json round trip with their
 * arguments; groups that do not divide the channels, slices outside them and a LayerNorm axis past
 * the tensor's are refused by the builder and the reader. */
static void json_keeps_moves_and_norms(void **state)
{
    (void)state;
    ch_err err;
    ch_graph *g, *back;
    assert_int_equal(ch_graph_create("moves", &g, &err), CH_STATUS_OK);
    int x = ch_graph_input(g, "x", 6, 2, 2);
    x = ch_graph_channel_shuffle(g, "shuffle", x, 3);
    x = ch_graph_channel_slice(g, "slice", x, 2, 3);
    assert_int_equal(ch_graph_shape(g, x).c, 3);
    x = ch_graph_layer_norm(g, "ln_c", x, CH_LAYER_NORM_CHANNELS, 1e-6);
    x = ch_graph_layer_norm(g, "ln_hw", x, 2, 3e-4);
    x = ch_graph_conv_transpose2d(g, "up", x, &(ch_conv2d_args){ .out_channels = 2, .kernel = 3, .stride = 2, .padding = 1 }, 1);
    assert_int_equal(ch_graph_shape(g, x).h, 4);
    x = ch_graph_upsample_bilinear(g, "resize", x, 7, 5, true);
    x = ch_graph_permute(g, "perm", x, (const int[4]){ 0, 3, 1, 2 });
    assert_int_equal(ch_graph_shape(g, x).c, 5);
    assert_int_equal(ch_graph_shape(g, x).h, 2);
    assert_int_equal(ch_graph_shape(g, x).w, 7);
    ch_graph_output(g, ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", x), 3, true));
    char *text = ch_graph_to_json(g), *again;
    assert_non_null(text);
    assert_int_equal(ch_graph_from_json(text, strlen(text), "moves", &back, &err), CH_STATUS_OK);
    assert_non_null(again = ch_graph_to_json(back));
    assert_string_equal(text, again);
    assert_int_equal(back->nodes[0].op, CH_GOP_SHUFFLE);
    assert_int_equal(back->nodes[0].groups, 3);
    assert_int_equal(back->nodes[1].op, CH_GOP_SLICE);
    assert_int_equal(back->nodes[1].slice[0], 2);
    assert_int_equal(back->nodes[1].slice[1], 3);
    assert_int_equal(back->nodes[2].ln_axis, CH_LAYER_NORM_CHANNELS);
    assert_true(back->nodes[2].bn.eps == 1e-6);
    assert_int_equal(back->nodes[3].ln_axis, 2);
    assert_true(back->nodes[3].bn.eps == 3e-4);
    assert_int_equal(back->nodes[4].op, CH_GOP_CONV_T);
    assert_int_equal(back->nodes[4].out_pad, 1);
    assert_int_equal(back->nodes[4].conv.stride, 2);
    assert_int_equal(back->nodes[5].op, CH_GOP_BILINEAR);
    assert_int_equal(back->nodes[5].scale[0], 7);
    assert_int_equal(back->nodes[5].scale[1], 5);
    assert_true(back->nodes[5].align);
    assert_int_equal(back->nodes[6].op, CH_GOP_PERMUTE);
    assert_memory_equal(back->nodes[6].view, ((const int[3]){ 2, 0, 1 }), sizeof(int[3]));
    assert_non_null(strstr(text, "\"perm\":\t[0, 3, 1, 2]"));
    free(again);
    /* The slice read back as 4 channels from 2 of 6: past the end. */
    char *bad = malloc(strlen(text) + 8), *at = strstr(text, "\"count\"");
    assert_non_null(at);
    at = strchr(at, ':');
    sprintf(bad, "%.*s: 5%s", (int)(at - text), text, strpbrk(at, ",}"));
    ch_graph *refused = NULL;
    assert_int_equal(ch_graph_from_json(bad, strlen(bad), "moves", &refused, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "channels 2..6 of 6"));
    free(bad), free(text);
    ch_graph_free(back);
    ch_graph_free(g);
    assert_int_equal(ch_graph_create("moves", &g, &err), CH_STATUS_OK);
    assert_true(ch_graph_channel_shuffle(g, "s", ch_graph_input(g, "x", 6, 2, 2), 4) < 0);
    assert_int_equal(ch_graph_status(g, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "4 groups do not divide 6 channels"));
    ch_graph_free(g);
    assert_int_equal(ch_graph_create("moves", &g, &err), CH_STATUS_OK);
    x = ch_graph_flatten(g, "flat", ch_graph_input(g, "x", 6, 2, 2));
    assert_true(ch_graph_layer_norm(g, "n", x, 2, 1e-5) < 0);
    assert_int_equal(ch_graph_status(g, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "the axis 1..3 (1 on features)"));
    ch_graph_free(g);
    /* A permute that moves the batch, or is no order of 1, 2, 3. */
    static const int bad_perms[3][4] = { { 1, 0, 2, 3 }, { 0, 1, 1, 2 }, { 0, 1, 2, 4 } };
    static const char *const says[3] = { "the batch must stay first", "is not an order", "is not an order" };
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ch_graph_create("moves", &g, &err), CH_STATUS_OK);
        assert_true(ch_graph_permute(g, "p", ch_graph_input(g, "x", 6, 2, 2), bad_perms[i]) < 0);
        assert_int_equal(ch_graph_status(g, &err), CH_STATUS_BAD_INPUT);
        assert_non_null(strstr(err.msg, says[i]));
        ch_graph_free(g);
    }
}

/* A reused node: graph.json names what it reuses and reads back the same; the model has the twin's
 * tensors once (a reused BatchNorm its running statistics and counter too); reuse of a node without
 * parameters, of an unknown name, on an input giving other parameter shapes, or a "reuses" whose op
 * differs, is refused naming it. */
static void reuse_ties_parameters(void **state)
{
    (void)state;
    ch_err err;
    ch_graph *g, *back;
    assert_int_equal(ch_graph_create("tied", &g, &err), CH_STATUS_OK);
    int x = ch_graph_input(g, "x", 3, 4, 4);
    const ch_conv2d_args c = { .out_channels = 3, .kernel = 3, .padding = 1 };
    x = ch_graph_reuse(g, "conv_again", "conv", ch_graph_relu(g, "r", ch_graph_conv2d(g, "conv", x, &c)));
    ch_graph_output(g, ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", x), 3, true));
    char *text = ch_graph_to_json(g), *again;
    assert_non_null(strstr(text, "\"reuses\":\t\"conv\""));
    assert_int_equal(ch_graph_from_json(text, strlen(text), "tied", &back, &err), CH_STATUS_OK);
    assert_non_null(again = ch_graph_to_json(back));
    assert_string_equal(text, again);
    assert_int_equal(back->nodes[2].tied, 1);
    ch_model *m;
    assert_int_equal(ch_model_create_graph(back, (ch_shape3){ 3, 4, 4 }, 3, ch_backend_host(), &m, &err), CH_STATUS_OK);
    assert_int_equal(m->ntensors, 4);                       /* conv.weight, conv.bias, fc.weight, fc.bias */
    assert_int_equal(m->nparams, 3 * 3 * 9 + 3 + 3 * 48 + 3);
    assert_int_equal(m->ntied, 3 * 3 * 9 + 3);
    ch_model_free(m);
    char *bad = malloc(strlen(text) + 16), *at = strstr(text, "\"op\":\t\"conv2d\"");
    at = strstr(at + 1, "\"op\":\t\"conv2d\"");   /* the reusing node's */
    assert_non_null(at);
    sprintf(bad, "%.*s\"op\":\t\"linear\"%s", (int)(at - text), text, at + strlen("\"op\":\t\"conv2d\""));
    ch_graph *refused = NULL;
    assert_int_equal(ch_graph_from_json(bad, strlen(bad), "tied", &refused, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "op 'linear' reuses a conv2d node"));
    free(bad), free(text), free(again);
    ch_graph_free(back);
    ch_graph_free(g);
    assert_int_equal(ch_graph_create("tied", &g, &err), CH_STATUS_OK);
    x = ch_graph_batchnorm2d(g, "bn", ch_graph_input(g, "x", 3, 4, 4), NULL);
    x = ch_graph_reuse(g, "bn_again", "bn", ch_graph_relu(g, "r", x));
    ch_graph_output(g, ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", x), 3, true));
    assert_int_equal(ch_graph_status(g, &err), CH_STATUS_OK);
    assert_int_equal(ch_model_create_graph(g, (ch_shape3){ 3, 4, 4 }, 3, ch_backend_host(), &m, &err), CH_STATUS_OK);
    assert_int_equal(m->ntensors, 7);   /* bn's weight, bias, running_mean, running_var, counter; fc's two */
    assert_int_equal(m->nbuffers, 2 * 3);
    assert_int_equal(m->ncounters, 1);
    assert_int_equal(m->ntied, 2 * 3);
    ch_model_free(m);
    ch_graph_free(g);
    static const char *const want[3] = { "no node named 'nothing' before it", "only conv2d, conv_transpose2d, linear, layer_norm and batchnorm",
                                         "gives parameters of other shapes" };
    for (int k = 0; k < 3; k++) {
        assert_int_equal(ch_graph_create("tied", &g, &err), CH_STATUS_OK);
        x = ch_graph_input(g, "x", 3, 4, 4);
        const int y = ch_graph_relu(g, "r", ch_graph_batchnorm2d(g, "bn", ch_graph_conv2d(g, "conv", x, &(ch_conv2d_args){ .out_channels = 2, .kernel = 1 }), NULL));
        assert_true(ch_graph_reuse(g, "again", k == 0 ? "nothing" : k == 1 ? "r" : "conv", y) < 0);
        assert_int_equal(ch_graph_status(g, &err), CH_STATUS_BAD_INPUT);
        assert_non_null(strstr(err.msg, want[k]));
        ch_graph_free(g);
    }
}

/* One op on a 4x6x6 input with argument v; -1 when the builder refuses it. */
static int one_op(ch_graph *g, int which, double v)
{
    const int x = ch_graph_input(g, "x", 4, 6, 6);
    switch (which) {
    case 0: return ch_graph_batchnorm2d(g, "n", x, &(ch_batchnorm_args){ .eps = v, .momentum = 0.3 });
    case 1: return ch_graph_batchnorm2d(g, "n", x, &(ch_batchnorm_args){ .eps = 1e-3, .momentum = v });
    case 2: return ch_graph_leaky_relu(g, "n", x, v);
    case 3: return ch_graph_clip(g, "n", x, -1, v);
    case 4: return ch_graph_clip(g, "n", x, v, INFINITY);
    case 5: return ch_graph_affine(g, "n", x, v, 0.5);
    case 6: return ch_graph_affine(g, "n", x, 2, v);
    default: return ch_graph_dropout(g, "n", x, v);
    }
}

/* What is written is always readable: for every real argument, at and around the edges of its
 * range (and the float roundings that cross them: 1e30 as float is above 1e30), a graph the
 * builder accepts reads back from graph.json to the same JSON, and the builder refuses what the
 * reader would. Once the importer took BatchNorm eps 1e-13 or x / 1e-30 and every checkpoint of
 * the run was refused. */
static void json_reads_what_the_builder_takes(void **state)
{
    (void)state;
    static const double edges[] = { 0, 1e-13, 1e-12, 9.99e-13, 1e-5, 0.5, 0.999999, 0.9999995, 1, 1.5, 1e6, 1.0000001e6,
                                    -1e6, 2e6, 1e29, 9.9999997e29, 1e30, 1.00000002e30, -1e30, 1e31, INFINITY, NAN };
    int accepted = 0, refused = 0;
    for (int which = 0; which < 8; which++)
        for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) {
            const double v = edges[i];
            ch_graph *g;
            ch_err err;
            assert_int_equal(ch_graph_create("edge", &g, &err), CH_STATUS_OK);
            const int y = one_op(g, which, v);
            if (y < 0) {
                refused++;
                ch_graph_free(g);
                continue;
            }
            accepted++;
            ch_graph_output(g, ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", y), 3, true));
            assert_int_equal(ch_graph_status(g, &err), CH_STATUS_OK);
            char *text = ch_graph_to_json(g), *again = NULL;
            assert_non_null(text);
            ch_graph *back = NULL;
            if (ch_graph_from_json(text, strlen(text), "edge", &back, &err) != CH_STATUS_OK)
                fail_msg("op %d, value %.17g: the builder took it, graph.json refuses it: %s", which, v, err.msg);
            assert_non_null(again = ch_graph_to_json(back));
            assert_string_equal(text, again);
            free(text);
            free(again);
            ch_graph_free(back);
            ch_graph_free(g);
        }
    /* Both sides of every range are tried. */
    assert_true(accepted > 40 && refused > 40);
}

static void fingerprint_follows_the_graph(void **state)
{
    (void)state;
    ch_graph *a = small_net(1), *b = small_net(1), *c = small_net(2);
    ch_err err;
    uint64_t fa, fb, fc;
    assert_int_equal(ch_graph_fingerprint(a, &fa, &err), CH_STATUS_OK);
    assert_int_equal(ch_graph_fingerprint(b, &fb, &err), CH_STATUS_OK);
    assert_int_equal(ch_graph_fingerprint(c, &fc, &err), CH_STATUS_OK);
    assert_true(fa == fb);
    assert_true(fa != fc);
    /* graph.json holds the whole graph: read back, it is the same graph. */
    char *text = ch_graph_to_json(c);
    assert_non_null(text);
    ch_graph *d;
    uint64_t fd;
    assert_int_equal(ch_graph_from_json(text, strlen(text), "test", &d, &err), CH_STATUS_OK);
    assert_int_equal(ch_graph_fingerprint(d, &fd, &err), CH_STATUS_OK);
    assert_true(fd == fc);
    free(text);
    ch_graph_free(d);
    ch_graph_free(a);
    ch_graph_free(b);
    ch_graph_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(builder_refusals),
        cmocka_unit_test(first_error_sticks),
        cmocka_unit_test(compile_checks),
        cmocka_unit_test(gradient_blocks_are_reused),
        cmocka_unit_test(relu_fusion_only_for_the_one_reader),
        cmocka_unit_test(broadcasting_follows_pytorch),
        cmocka_unit_test(fingerprint_follows_the_graph),
        cmocka_unit_test(json_keeps_every_op),
        cmocka_unit_test(json_keeps_gelu_forms),
        cmocka_unit_test(json_keeps_moves_and_norms),
        cmocka_unit_test(reuse_ties_parameters),
        cmocka_unit_test(json_reads_what_the_builder_takes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
