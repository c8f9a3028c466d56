/* The loader's two pixel loops that OpenCV does not offer at this cost, with exactly OpenCV's pixels:
 *   - decode one rectangle of a baseline or progressive 8-bit YCbCr JPEG with libjpeg(-turbo)'s cropping
 *     and scanline skipping, into a caller's BGR buffer at the rectangle's true offset;
 *   - a per-channel lookup table (the HSV jitter's) fused with the image flips, in one pass.
 *
 * Loaded with ctypes by yolov5_smddp/data/native.py; the policy (which rectangle, the margin for the
 * upsampling context, the self-checks against OpenCV, the fall back to OpenCV) lives in jpeg_roi.py and
 * augment.py; this file only computes. Built in the Dockerfile:
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
 *   yv5_lut3_flip(src, src_stride, dst, dst_stride, height, width, table, flip_lr, flip_ud) -> 0
 *     dst[y', x', c] = table[3 * src[y, x, c] + c] for uint8 [height, width, 3] images (strides in bytes),
 *     with x' = width - 1 - x when flip_lr, y' = height - 1 - y when flip_ud (else x, y); table is
 *     uint8 [256, 3] (cv2.LUT's 3-channel table). src and dst must not overlap.
 */
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#define YV5_ROI_ABI 2
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

int yv5_roi_decode(const unsigned char *data, unsigned long size, int width, int height, int *rect,
                   unsigned char *out, long stride) {
    struct jpeg_decompress_struct cinfo;
    struct roi_error err;
    JSAMPROW rows[ROWS_PER_CALL];
    JDIMENSION xoff, xwidth;
    int x0 = rect[0], y0 = rect[1], x1 = rect[2], y1 = rect[3];

    if (data == NULL || out == NULL || width <= 0 || height <= 0 || x0 < 0 || y0 < 0 || x1 > width ||
        y1 > height || x0 >= x1 || y0 >= y1 || stride < 3L * width)
        return YV5_ROI_BAD_ARGS;
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
    jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.num_components != 3 || cinfo.jpeg_color_space != JCS_YCbCr || cinfo.data_precision != 8 ||
        (int)cinfo.image_width != width || (int)cinfo.image_height != height || exif_may_rotate(&cinfo)) {
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
    rect[0] = (int)xoff;
    rect[2] = (int)(xoff + xwidth);
    return YV5_ROI_OK;
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
