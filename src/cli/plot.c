/* SVG charts of training curves. One chart: x = epoch, y from 0 to max(1, the largest loss) as in
 * d2l's Animator, one colour per metric (train loss, train acc, test acc) and one dash pattern per
 * run; axes with ticks and labels, grid, legend, title. Plain SVG 1.1: renders in browsers and in
 * rsvg-convert. */
#include "cli/plot.h"
#include "core/file.h"
#include "io/json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { W = 720, H = 420, ML = 64, MR = 230, MT = 48, MB = 56 };

static const char *const colours[3] = { "#1f77b4", "#d62728", "#2ca02c" };
static const char *const metric_names[3] = { "train loss", "train acc", "test acc" };
static const char *const dashes[CH_PLOT_MAX_RUNS] = { "", "6,4", "2,3", "10,3,2,3", "1,5", "8,8", "4,1", "12,2" };

ch_status ch_plot_add(ch_plot_run *r, int epoch, double loss, double train_acc, double test_acc, ch_err *err)
{
    if (r->n == CH_PLOT_MAX_EPOCHS) return ch_fail(err, CH_STATUS_BAD_INPUT, "more than %d epochs to plot", CH_PLOT_MAX_EPOCHS);
    if (r->n == r->cap) {
        const int cap = r->cap ? 2 * r->cap : 16;
        double *arrs[4] = { r->epoch, r->loss, r->train_acc, r->test_acc };
        for (int i = 0; i < 4; i++) {
            double *p = realloc(arrs[i], sizeof(double) * (size_t)cap);
            if (!p) return CH_SYS_FAIL(err, "allocation of plot data");
            arrs[i] = p;
        }
        r->epoch = arrs[0], r->loss = arrs[1], r->train_acc = arrs[2], r->test_acc = arrs[3];
        r->cap = cap;
    }
    r->epoch[r->n] = epoch;
    r->loss[r->n] = loss;
    r->train_acc[r->n] = train_acc;
    r->test_acc[r->n] = test_acc;
    r->n++;
    return CH_STATUS_OK;
}

void ch_plot_run_free(ch_plot_run *r)
{
    free(r->epoch);
    free(r->loss);
    free(r->train_acc);
    free(r->test_acc);
    *r = (ch_plot_run){ 0 };
}

static double num(const cJSON *o, const char *k, double fallback)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : fallback;
}

ch_status ch_plot_read_metrics(const char *path, const char *label, ch_plot_run *r, ch_err *err)
{
    const int fd = ch_file_open_input(path, NULL, err);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return fd < 0 ? CH_STATUS_BAD_INPUT : ch_fail(err, CH_STATUS_SYSTEM, "%s: fdopen failed", path);
    }
    snprintf(r->label, sizeof r->label, "%s", label);
    char line[8192];
    ch_status st = CH_STATUS_OK;
    for (int no = 1; st == CH_STATUS_OK && fgets(line, sizeof line, f); no++) {
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        cJSON *o = cJSON_Parse(line);
        /* A diverged epoch's loss is null (JSON has no NaN): kept, and left out of the chart. */
        const cJSON *lv = cJSON_GetObjectItemCaseSensitive(o, "loss");
        const double e = num(o, "epoch", -1), l = cJSON_IsNull(lv) ? NAN : num(o, "loss", -1);
        if (!cJSON_IsObject(o) || ch_json_duplicate_key(o) || !(e >= 1 && e <= 1e9 && e == floor(e)) ||
            !(isnan(l) || l >= 0))
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s:%d: not a cohort metrics line (JSON with a whole epoch "
                         "1..1e9 and a loss >= 0 or null)", path, no);
        else
            st = ch_plot_add(r, (int)e, l, num(o, "train_acc", -1), num(o, "test_acc", -1), err);
        cJSON_Delete(o);
    }
    fclose(f);
    if (st == CH_STATUS_OK && r->n == 0) st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: no epochs in it", path);
    return st;
}

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

/* A "nice" tick step (1, 2 or 5 x 10^k) giving about `want` ticks over span. */
static double tick_step(double span, int want)
{
    const double raw = span / want, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

typedef struct frame {
    double x0, x1, y1;          /* data ranges (y from 0) */
} frame;

static double px(const frame *fr, double x) { return ML + (x - fr->x0) / (fr->x1 - fr->x0) * (W - ML - MR); }
static double py(const frame *fr, double y) { return H - MB - y / fr->y1 * (H - MT - MB); }

static void axes(FILE *f, const frame *fr, const char *title)
{
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fputs("<text x=\"360\" y=\"26\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">", f);
    xml_text(f, title);
    fputs("</text>\n", f);
    /* Ticks by count, not by adding steps: at 1e308 a step no longer moves the sum. */
    const double ys = tick_step(fr->y1, 5);
    const int ny = (int)fmin(20, floor(fr->y1 / ys + 1e-9));
    for (int i = 0; i <= ny; i++) {
        const double y = i * ys;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", ML, py(fr, y), W - MR, py(fr, y));
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"12\">%g</text>\n", ML - 6, py(fr, y) + 4, y);
    }
    const double span = fr->x1 - fr->x0, xs = fmax(1, tick_step(span, 10));
    const int nx = (int)fmin(40, floor((fr->x1 - ceil(fr->x0)) / xs + 1e-9));
    for (int i = 0; i <= nx; i++) {
        const double x = ceil(fr->x0) + i * xs;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e0e0e0\"/>\n", px(fr, x), MT, px(fr, x), H - MB);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">%g</text>\n", px(fr, x), H - MB + 18, x);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"black\"/>\n", ML, MT, W - ML - MR, H - MT - MB);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\">epoch</text>\n", (ML + W - MR) / 2, H - 16);
}

static const double *series(const ch_plot_run *r, int m) { return m == 0 ? r->loss : m == 1 ? r->train_acc : r->test_acc; }

static void curves(FILE *f, const frame *fr, const ch_plot_run *runs, int nruns)
{
    for (int k = 0; k < nruns; k++)
        for (int m = 0; m < 3; m++) {
            const double *v = series(&runs[k], m);
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s%s%s points=\"", colours[m],
                    dashes[k][0] ? " stroke-dasharray=\"" : "", dashes[k], dashes[k][0] ? "\"" : "");
            for (int i = 0; i < runs[k].n; i++)
                if (v[i] >= 0) fprintf(f, "%.1f,%.1f ", px(fr, runs[k].epoch[i]), py(fr, v[i]));
            fputs("\"/>\n", f);
            for (int i = 0; i < runs[k].n; i++)
                if (v[i] >= 0)
                    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(fr, runs[k].epoch[i]), py(fr, v[i]), colours[m]);
        }
}

static void legend(FILE *f, const ch_plot_run *runs, int nruns)
{
    int y = MT + 8;
    for (int k = 0; k < nruns; k++)
        for (int m = 0; m < 3; m++, y += 20) {
            fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s%s%s/>\n",
                    W - MR + 14, y, W - MR + 44, y, colours[m], dashes[k][0] ? " stroke-dasharray=\"" : "",
                    dashes[k], dashes[k][0] ? "\"" : "");
            fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">", W - MR + 50, y + 4);
            if (nruns > 1) {
                xml_text(f, runs[k].label);
                fputs(": ", f);
            }
            fprintf(f, "%s</text>\n", metric_names[m]);
        }
}

static frame frame_of(const ch_plot_run *runs, int nruns)
{
    frame fr = { 1e300, -1e300, 1 };
    for (int k = 0; k < nruns; k++)
        for (int i = 0; i < runs[k].n; i++) {
            fr.x0 = fmin(fr.x0, runs[k].epoch[i]);
            fr.x1 = fmax(fr.x1, runs[k].epoch[i]);
            /* Capped well below DBL_MAX, so the axis top rounded up to a tick stays finite. */
            if (isfinite(runs[k].loss[i])) fr.y1 = fmax(fr.y1, fmin(runs[k].loss[i], 1e300));
        }
    if (fr.x1 - fr.x0 < 1) {
        fr.x0 -= 0.5;
        fr.x1 += 0.5;
    }
    const double s = tick_step(fr.y1, 5);
    fr.y1 = ceil(fr.y1 / s - 1e-9) * s;
    return fr;
}

ch_status ch_plot_write_svg(const char *path, const char *title, const ch_plot_run *runs, int nruns, ch_err *err)
{
    if (nruns < 1 || nruns > CH_PLOT_MAX_RUNS) return ch_fail(err, CH_STATUS_BAD_INPUT, "%d runs to plot, expected 1..%d", nruns, CH_PLOT_MAX_RUNS);
    ch_out out;
    CH_TRY(ch_out_open(&out, path, "the chart", err));
    FILE *f = out.f;
    const frame fr = frame_of(runs, nruns);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n", W, H, W, H);
    axes(f, &fr, title);
    curves(f, &fr, runs, nruns);
    legend(f, runs, nruns);
    fputs("</svg>\n", f);
    return ch_out_commit(&out, err);
}
