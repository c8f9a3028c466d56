/* The loader's two pixel loops that OpenCV does not offer at this cost, with exactly OpenCV's pixels:
 *   - decode one rectangle of a baseline or progressive 8-bit YCbCr JPEG with libjpeg(-turbo)'s cropping
 *     and scanline skipping, into a caller's BGR buffer at the rectangle's true offset;
 *   - a per-channel lookup table (the HSV jitter's) fused with the image flips, in one pass.
 *
 * Loaded with ctypes by yolov5_smddp/data/native.py; the policy (which rectangle, the margin for the
 * upsampling context, the self-checks against OpenCV, the fall back to OpenCV) lives in jpeg_roi.py and
 * augment.py; this file only computes. `pip install` builds it into the package (setup.py), the same as
 *     gcc -O2 -shared -fPIC -o libyolov5_smddp_native.so native.c -ljpeg
 * It needs libjpeg-turbo >= 1.5 (jpeg_skip_scanlines, jpeg_crop_scanline, JCS_EXT_BGR).
 *
 * The decoder settings are OpenCV's for IMREAD_COLOR (libjpeg's defaults: JDCT_ISLOW, fancy upsampling;
 * output JCS_EXT_BGR), so the rectangle's pixels are the ones cv2.imdecode gives; the Python side checks
 * that once per process on an embedded image before using this path.
 *
 * C ABI (all functions return an int status):
 *   yv5_roi_abi()                             -> 2 (the ABI version below)
 *   yv5_roi_decode(data, size, width, height, rect[4], out, stride) -> YV5_ROI_*
 *     data/size: the file's bytes; width/height: the size the caller expects (a mismatch is unsupported);
 *     rect: in = x0, y0, x1, y1 wanted (pixels, clipped by the caller), out = the rectangle written
 *     (x0 rounded down to an iMCU column by libjpeg, x1 up); out/stride: the first pixel of a
 *     height x width x 3 uint8 buffer and its row stride in bytes. Only the rows and columns of the
 *     written rectangle are touched.
 *   yv5_rst_transcode(data, size, width, height, &result, &result_size) -> YV5_ROI_*
 *     a lossless copy of the JPEG (the same DCT coefficients, quantisation tables, sampling and component
 *     ids, so the same pixels; one sequential scan, optimised Huffman tables) with a restart marker after
 *     every MCU. Declines (UNSUPPORTED) what yv5_roi_decode declines, and a progressive file with
 *     coefficient bits never sent (libjpeg decodes those with block smoothing, a sequential copy would
 *     not be). On OK, *result is a malloc'd buffer of *result_size bytes: free it with yv5_free.
 *   yv5_rst_decode(data, size, width, height, rect[4], out, stride, scratch, scratch_size) -> YV5_ROI_*
 *     yv5_roi_decode for a file written by yv5_rst_transcode, entropy-decoding only the MCUs that hold
 *     the rectangle: a JPEG of just their restart segments (the headers with the SOF size patched, the
 *     markers renumbered from RST0, EOI) is built in scratch (at least size + 2 bytes) and decoded whole
 *     (rows above the rectangle inside its first MCU row skipped, none read after its last row), its
 *     pixels written at their true offset in out; rect out = the columns written (whole MCUs). Pixels
 *     that are not the full decode's: the first and last rows and columns of that JPEG (upsampling
 *     context), unless they are the image's own edges, so the caller widens the rectangle by one pixel.
 *     UNSUPPORTED for any other layout (no restart after every MCU, several scans, progressive).
 *   yv5_lut3_flip(src, src_stride, dst, dst_stride, height, width, table, flip_lr, flip_ud) -> 0
 *     dst[y', x', c] = table[3 * src[y, x, c] + c] for uint8 [height, width, 3] images (strides in bytes),
 *     with x' = width - 1 - x when flip_lr, y' = height - 1 - y when flip_ud (else x, y); table is
 *     uint8 [256, 3] (cv2.LUT's 3-channel table). src and dst must not overlap.
 */
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#define YV5_ROI_ABI 3
#define YV5_ROI_OK 0
#define YV5_ROI_UNSUPPORTED 1 /* a file this path does not handle: the caller decodes the whole image */
#define YV5_ROI_FAILED 2      /* a libjpeg error or warning: the caller decodes the whole image */
#define YV5_ROI_BAD_ARGS 3

#define ROWS_PER_CALL 16

struct roi_error {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
};

static void roi_error_exit(j_common_ptr cinfo) {
    struct roi_error *err = (struct roi_error *)cinfo->err;
    longjmp(err->jump, 1);
}

static void roi_emit_message(j_common_ptr cinfo, int level) {
    if (level < 0) cinfo->err->num_warnings++; /* corrupt data: counted, the caller falls back */
}

static void roi_output_message(j_common_ptr cinfo) { (void)cinfo; }

static unsigned read16(const unsigned char *p, int little) {
    return little ? (unsigned)(p[0] | p[1] << 8) : (unsigned)(p[0] << 8 | p[1]);
}

static unsigned long read32(const unsigned char *p, int little) {
    return little ? ((unsigned long)p[0] | (unsigned long)p[1] << 8 | (unsigned long)p[2] << 16 |
                     (unsigned long)p[3] << 24)
                  : ((unsigned long)p[0] << 24 | (unsigned long)p[1] << 16 | (unsigned long)p[2] << 8 |
                     (unsigned long)p[3]);
}

/* 1 when an Exif APP1 segment may make a decoder rotate or flip the image (an orientation tag other
 * than 1 in IFD0, or a segment this reader cannot follow), else 0. */
static int exif_may_rotate(j_decompress_ptr cinfo) {
    jpeg_saved_marker_ptr m;
    for (m = cinfo->marker_list; m != NULL; m = m->next) {
        const unsigned char *d = m->data;
        unsigned long n = m->data_length, ifd, i, count;
        int little;
        if (m->marker != JPEG_APP0 + 1 || n < 6 || memcmp(d, "Exif\0\0", 6) != 0) continue;
        d += 6;
        n -= 6;
        if (n < 8) return 1;
        if (d[0] == 'I' && d[1] == 'I') little = 1;
        else if (d[0] == 'M' && d[1] == 'M') little = 0;
        else return 1;
        ifd = read32(d + 4, little);
        if (ifd + 2 > n) return 1;
        count = read16(d + ifd, little);
        if (ifd + 2 + count * 12 > n) return 1;
        for (i = 0; i < count; i++) {
            const unsigned char *e = d + ifd + 2 + i * 12;
            if (read16(e, little) == 0x0112 && read16(e + 8, little) != 1) return 1;
        }
    }
    return 0;
}

int yv5_roi_abi(void) { return YV5_ROI_ABI; }

/* Decode rows y0..y1 and (at least) columns x0..x1 of the JPEG in data/size into out (the pixel that
 * stands for the image's (0, 0); rows `stride` bytes apart). The file must be an 8-bit 3-component
 * YCbCr JPEG of width x height (and, with check_exif, upright). On YV5_ROI_OK, xoff_out and xwidth_out
 * hold the columns written (rounded out to iMCU columns by libjpeg). */
static int decode_rows(const unsigned char *data, unsigned long size, int width, int height, int check_exif,
                       int x0, int y0, int x1, int y1, unsigned char *out, long stride, JDIMENSION *xoff_out,
                       JDIMENSION *xwidth_out) {
    struct jpeg_decompress_struct cinfo;
    struct roi_error err;
    JSAMPROW rows[ROWS_PER_CALL];
    JDIMENSION xoff, xwidth;

    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = roi_error_exit;
    err.mgr.emit_message = roi_emit_message;
    err.mgr.output_message = roi_output_message;
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return YV5_ROI_FAILED;
    }
    jpeg_mem_src(&cinfo, data, size);
    if (check_exif) jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.num_components != 3 || cinfo.jpeg_color_space != JCS_YCbCr || cinfo.data_precision != 8 ||
        (int)cinfo.image_width != width || (int)cinfo.image_height != height ||
        (check_exif && exif_may_rotate(&cinfo))) {
        jpeg_destroy_decompress(&cinfo);
        return YV5_ROI_UNSUPPORTED;
    }
    cinfo.out_color_space = JCS_EXT_BGR;
    jpeg_start_decompress(&cinfo);
    xoff = (JDIMENSION)x0;
    xwidth = (JDIMENSION)(x1 - x0);
    if (xwidth < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &xwidth);
    if (y0 > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)y0) != (JDIMENSION)y0) {
        jpeg_destroy_decompress(&cinfo);
        return YV5_ROI_FAILED;
    }
    while ((int)cinfo.output_scanline < y1) {
        int k, n = y1 - (int)cinfo.output_scanline;
        if (n > ROWS_PER_CALL) n = ROWS_PER_CALL;
        for (k = 0; k < n; k++) rows[k] = out + (ptrdiff_t)(cinfo.output_scanline + k) * stride + 3 * (ptrdiff_t)xoff;
        if (jpeg_read_scanlines(&cinfo, rows, (JDIMENSION)n) == 0) break;
    }
    if ((int)cinfo.output_scanline < y1 || err.mgr.num_warnings != 0) {
        jpeg_destroy_decompress(&cinfo);
        return YV5_ROI_FAILED;
    }
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    *xoff_out = xoff;
    *xwidth_out = xwidth;
    return YV5_ROI_OK;
}

static int bad_rect(int width, int height, const int *rect, long stride) {
    return width <= 0 || height <= 0 || rect[0] < 0 || rect[1] < 0 || rect[2] > width || rect[3] > height ||
           rect[0] >= rect[2] || rect[1] >= rect[3] || stride < 3L * width;
}

int yv5_roi_decode(const unsigned char *data, unsigned long size, int width, int height, int *rect,
                   unsigned char *out, long stride) {
    JDIMENSION xoff, xwidth;
    int status;

    if (data == NULL || out == NULL || bad_rect(width, height, rect, stride)) return YV5_ROI_BAD_ARGS;
    status = decode_rows(data, size, width, height, 1, rect[0], rect[1], rect[2], rect[3], out, stride, &xoff,
                         &xwidth);
    if (status == YV5_ROI_OK) {
        rect[0] = (int)xoff;
        rect[2] = (int)(xoff + xwidth);
    }
    return status;
}

/* ---- restart-marker files: a lossless copy whose MCUs can be found without entropy decoding */

int yv5_rst_transcode(const unsigned char *data, unsigned long size, int width, int height,
                      unsigned char **result, unsigned long *result_size) {
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    struct roi_error err; /* shared by both: one setjmp */
    jvirt_barray_ptr *coefs;
    unsigned char *volatile buffer = NULL;
    unsigned long buffer_size = 0;
    int ci, k;

    if (data == NULL || result == NULL || result_size == NULL || width <= 0 || height <= 0)
        return YV5_ROI_BAD_ARGS;
    *result = NULL;
    *result_size = 0;
    src.err = jpeg_std_error(&err.mgr);
    dst.err = &err.mgr;
    err.mgr.error_exit = roi_error_exit;
    err.mgr.emit_message = roi_emit_message;
    err.mgr.output_message = roi_output_message;
    jpeg_create_decompress(&src);
    jpeg_create_compress(&dst);
    if (setjmp(err.jump)) {
        jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        free(buffer);
        return YV5_ROI_FAILED;
    }
    jpeg_mem_src(&src, data, size);
    jpeg_save_markers(&src, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&src, TRUE);
    /* the region decoder's own checks: what it declines is never transcoded */
    if (src.num_components != 3 || src.jpeg_color_space != JCS_YCbCr || src.data_precision != 8 ||
        (int)src.image_width != width || (int)src.image_height != height || exif_may_rotate(&src)) {
        jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        return YV5_ROI_UNSUPPORTED;
    }
    coefs = jpeg_read_coefficients(&src);
    if (err.mgr.num_warnings != 0) longjmp(err.jump, 1);
    /* A progressive file whose scans leave some coefficient bits unsent is decoded with block smoothing
     * (libjpeg's estimate of the missing bits), which a sequential copy would not do: not transcoded. */
    if (src.progressive_mode) {
        if (src.coef_bits == NULL) longjmp(err.jump, 1);
        for (ci = 0; ci < src.num_components; ci++)
            for (k = 0; k < DCTSIZE2; k++)
                if (src.coef_bits[ci][k] != 0) {
                    jpeg_destroy_compress(&dst);
                    jpeg_destroy_decompress(&src);
                    return YV5_ROI_UNSUPPORTED;
                }
    }
    jpeg_mem_dest(&dst, (unsigned char **)&buffer, &buffer_size);
    jpeg_copy_critical_parameters(&src, &dst); /* same quantisation tables, sampling and component ids */
    dst.optimize_coding = TRUE;
    dst.restart_interval = 1; /* a restart segment per MCU: a region's rows and columns can be cut out */
    jpeg_write_coefficients(&dst, coefs);
    jpeg_finish_compress(&dst);
    jpeg_finish_decompress(&src);
    if (err.mgr.num_warnings != 0) longjmp(err.jump, 1);
    jpeg_destroy_compress(&dst);
    jpeg_destroy_decompress(&src);
    *result = buffer;
    *result_size = buffer_size;
    return YV5_ROI_OK;
}

void yv5_free(void *p) { free(p); }

/* The layout of a restart-marker file (one sequential scan of all three components, a restart after
 * every MCU), read from its headers; 0 when it is something else. */
struct rst_layout {
    unsigned long sof;      /* offset of the SOF segment's length field */
    unsigned long scan;     /* offset of the first entropy-coded byte */
    int width, height;      /* the image's */
    int mcu_w, mcu_h;       /* pixels */
    int cols, rows;         /* MCUs */
};

static int rst_parse(const unsigned char *d, unsigned long n, struct rst_layout *l) {
    unsigned long p = 2;
    unsigned interval = 0;
    int hmax = 0, vmax = 0, ncomp = 0, i;
    memset(l, 0, sizeof(*l));
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return 0;
    while (p + 4 <= n) {
        unsigned marker, len;
        if (d[p] != 0xFF) return 0;
        marker = d[p + 1];
        if (marker == 0xFF) { p++; continue; }
        len = (unsigned)(d[p + 2] << 8 | d[p + 3]);
        if (len < 2 || p + 2 + len > n) return 0;
        if (marker == 0xC0 || marker == 0xC1) { /* baseline or extended sequential, Huffman */
            const unsigned char *s = d + p + 4;
            if (len < 8 || s[0] != 8) return 0;
            l->sof = p + 2;
            l->height = s[1] << 8 | s[2];
            l->width = s[3] << 8 | s[4];
            ncomp = s[5];
            if (ncomp != 3 || len != 8u + 3u * 3u) return 0;
            for (i = 0; i < 3; i++) {
                int h = s[7 + 3 * i] >> 4, v = s[7 + 3 * i] & 15;
                if (h > hmax) hmax = h;
                if (v > vmax) vmax = v;
            }
        } else if ((marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) ||
                   marker == 0xD8 || marker == 0xD9 || (marker >= 0xD0 && marker <= 0xD7)) {
            return 0; /* progressive, lossless, arithmetic-coded, or a misplaced marker */
        } else if (marker == 0xDD) {
            if (len != 4) return 0;
            interval = (unsigned)(d[p + 4] << 8 | d[p + 5]);
        } else if (marker == 0xDA) {
            if (l->sof == 0 || len != 12 || d[p + 4] != 3) return 0; /* one scan of the three components */
            l->scan = p + 2 + len;
            break;
        }
        p += 2 + len;
    }
    if (l->scan == 0 || l->width <= 0 || l->height <= 0 || hmax < 1 || vmax < 1 || hmax > 4 || vmax > 4)
        return 0;
    l->mcu_w = 8 * hmax;
    l->mcu_h = 8 * vmax;
    l->cols = (l->width + l->mcu_w - 1) / l->mcu_w;
    l->rows = (l->height + l->mcu_h - 1) / l->mcu_h;
    return interval == 1;
}

/* Copy into v (capacity cap) a JPEG of MCU rows r0..r1 and MCU columns c0..c1 of the restart file d:
 * its headers with the SOF size patched, the kept restart segments with their markers renumbered from
 * RST0, then EOI. The size written, or 0 when the file is not as its headers say (or v is too small). */
static unsigned long rst_extract(const unsigned char *d, unsigned long n, const struct rst_layout *l, int r0,
                                 int r1, int c0, int c1, unsigned char *v, unsigned long cap) {
    unsigned long seg_start = l->scan, p = l->scan, w;
    long k = 0, kept = 0;                                           /* k: the segment (= MCU) ending at p */
    long first = (long)r0 * l->cols, last = (long)r1 * l->cols; /* the MCUs of rows r0..r1 */
    int vw = c1 == l->cols ? l->width - c0 * l->mcu_w : (c1 - c0) * l->mcu_w;
    int vh = r1 == l->rows ? l->height - r0 * l->mcu_h : (r1 - r0) * l->mcu_h;

    if (l->scan > cap) return 0;
    memcpy(v, d, l->scan);
    v[l->sof + 3] = (unsigned char)(vh >> 8);
    v[l->sof + 4] = (unsigned char)(vh & 255);
    v[l->sof + 5] = (unsigned char)(vw >> 8);
    v[l->sof + 6] = (unsigned char)(vw & 255);
    w = l->scan;
    while (k < last) {
        const unsigned char *ff = memchr(d + p, 0xFF, n - p);
        unsigned marker;
        if (ff == NULL) return 0;
        p = (unsigned long)(ff - d);
        if (p + 1 >= n) return 0;
        marker = d[p + 1];
        if (marker == 0x00 || marker == 0xFF) { /* a stuffed 0xFF in the data, or fill before a marker */
            p += marker == 0x00 ? 2 : 1;
            continue;
        }
        if (marker >= 0xD0 && marker <= 0xD7) {
            if (marker != 0xD0 + (unsigned)(k & 7)) return 0;
        } else if (marker != 0xD9 || k != (long)l->rows * l->cols - 1) {
            return 0; /* EOI only after the last segment; any other marker: not our layout */
        }
        if (k >= first && k % l->cols >= c0 && k % l->cols < c1) {
            unsigned long len = p - seg_start;
            if (w + len + 2 > cap) return 0;
            if (kept > 0) { /* the marker before this segment, numbered in the new sequence */
                v[w++] = 0xFF;
                v[w++] = (unsigned char)(0xD0 + (kept - 1) % 8);
            }
            memcpy(v + w, d + seg_start, len);
            w += len;
            kept++;
        }
        k++;
        p += 2;
        seg_start = p;
    }
    if (w + 2 > cap) return 0;
    v[w++] = 0xFF;
    v[w++] = 0xD9;
    return w;
}

int yv5_rst_decode(const unsigned char *data, unsigned long size, int width, int height, int *rect,
                   unsigned char *out, long stride, unsigned char *scratch, unsigned long scratch_size) {
    struct rst_layout l;
    JDIMENSION xoff, xwidth;
    unsigned long vsize;
    int r0, r1, c0, c1, status, vw, vh;

    if (data == NULL || out == NULL || scratch == NULL || bad_rect(width, height, rect, stride))
        return YV5_ROI_BAD_ARGS;
    if (!rst_parse(data, size, &l) || l.width != width || l.height != height) return YV5_ROI_UNSUPPORTED;
    r0 = rect[1] / l.mcu_h;
    r1 = (rect[3] + l.mcu_h - 1) / l.mcu_h;
    c0 = rect[0] / l.mcu_w;
    c1 = (rect[2] + l.mcu_w - 1) / l.mcu_w;
    vsize = rst_extract(data, size, &l, r0, r1, c0, c1, scratch, scratch_size);
    if (vsize == 0) return YV5_ROI_FAILED;
    vw = c1 == l.cols ? l.width - c0 * l.mcu_w : (c1 - c0) * l.mcu_w;
    vh = r1 == l.rows ? l.height - r0 * l.mcu_h : (r1 - r0) * l.mcu_h;
    /* all the columns of the kept MCUs (no jpeg_crop_scanline: its cut edge would be one more edge) */
    status = decode_rows(scratch, vsize, vw, vh, 0, 0, rect[1] - r0 * l.mcu_h, vw, rect[3] - r0 * l.mcu_h,
                         out + (ptrdiff_t)r0 * l.mcu_h * stride + 3 * (ptrdiff_t)c0 * l.mcu_w, stride, &xoff,
                         &xwidth);
    if (status == YV5_ROI_OK) {
        rect[0] = c0 * l.mcu_w;
        rect[2] = c0 * l.mcu_w + vw;
    }
    return status;
}

int yv5_lut3_flip(const unsigned char *src, long src_stride, unsigned char *dst, long dst_stride, int height,
                  int width, const unsigned char *table, int flip_lr, int flip_ud) {
    int x, y;
    for (y = 0; y < height; y++) {
        const unsigned char *s = src + (ptrdiff_t)y * src_stride;
        unsigned char *d = dst + (ptrdiff_t)(flip_ud ? height - 1 - y : y) * dst_stride;
        if (flip_lr) {
            unsigned char *e = d + 3 * (ptrdiff_t)(width - 1);
            for (x = 0; x < width; x++, s += 3, e -= 3) {
                e[0] = table[3 * s[0]];
                e[1] = table[3 * s[1] + 1];
                e[2] = table[3 * s[2] + 2];
            }
        } else {
            for (x = 0; x < width; x++, s += 3, d += 3) {
                d[0] = table[3 * s[0]];
                d[1] = table[3 * s[1] + 1];
                d[2] = table[3 * s[2] + 2];
            }
        }
    }
    return 0;
}
