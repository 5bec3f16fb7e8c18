/*
 * The JPEG decoder of the image pipeline: a thin layer over the libjpeg API
 * of the system's libjpeg-turbo (SIMD), compiled by worker/build.rs.
 *
 * It exists in C because libjpeg reports errors by longjmp out of a callback:
 * the setjmp must sit in the frame that calls libjpeg, and Rust frames must
 * never be jumped over. Each function here catches every libjpeg error itself
 * and returns a code and a one-line message, so nothing unwinds into Rust.
 *
 * What it adds over a plain decode, and why:
 * - DCT scaling (scale_num/8): the IDCT produces a smaller image directly
 *   when a later resize shrinks it anyway.
 * - A region of interest: jpeg_skip_scanlines skips the IDCT and colour
 *   conversion of the rows above the region, the rows below are never
 *   entropy-decoded at all, and jpeg_crop_scanline limits the columns.
 *   A random-resized crop keeps about half of the image on average.
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

enum { LOADER_JPEG_OK = 0, LOADER_JPEG_ERROR = 1 };

struct loader_error {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
  char *msg;
  size_t msg_len;
};

static void loader_error_exit(j_common_ptr cinfo) {
  struct loader_error *e = (struct loader_error *)cinfo->err;
  if (e->msg != NULL && e->msg_len > 0) {
    char buf[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, buf);
    snprintf(e->msg, e->msg_len, "%s", buf);
  }
  longjmp(e->jump, 1);
}

/* libjpeg carries on after corrupt data with a warning and grey pixels; a
 * truncated file is an error here (as in Pillow), other warnings are not. */
static void loader_emit_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    loader_error_exit(cinfo);
  }
}

static void loader_output_message(j_common_ptr cinfo) { (void)cinfo; }

static void loader_init(struct jpeg_decompress_struct *cinfo,
                        struct loader_error *err, char *msg, size_t msg_len) {
  memset(err, 0, sizeof(*err));
  cinfo->err = jpeg_std_error(&err->pub);
  err->pub.error_exit = loader_error_exit;
  err->pub.emit_message = loader_emit_message;
  err->pub.output_message = loader_output_message;
  err->msg = msg;
  err->msg_len = msg_len;
}

/* Reads the header: full-size width and height. */
int loader_jpeg_header(const unsigned char *data, size_t len,
                       unsigned int *width, unsigned int *height, char *msg,
                       size_t msg_len) {
  struct jpeg_decompress_struct cinfo;
  struct loader_error err;
  loader_init(&cinfo, &err, msg, msg_len);
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return LOADER_JPEG_ERROR;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, (unsigned long)len);
  jpeg_read_header(&cinfo, TRUE);
  *width = cinfo.image_width;
  *height = cinfo.image_height;
  jpeg_destroy_decompress(&cinfo);
  return LOADER_JPEG_OK;
}

/* Adobe CMYK/YCCK JPEGs store inverted ink; the result matches Pillow's
 * convert("RGB") of such a file. Writes RGBX like the RGB path. */
static void cmyk_to_rgbx(const unsigned char *in, unsigned char *out,
                         unsigned int n, int inverted) {
  for (unsigned int i = 0; i < n; i++) {
    unsigned int c = in[4 * i], m = in[4 * i + 1], y = in[4 * i + 2],
                 k = in[4 * i + 3];
    if (!inverted) {
      c = 255 - c; m = 255 - m; y = 255 - y; k = 255 - k;
    }
    out[4 * i] = (unsigned char)((c * k + 127) / 255);
    out[4 * i + 1] = (unsigned char)((m * k + 127) / 255);
    out[4 * i + 2] = (unsigned char)((y * k + 127) / 255);
    out[4 * i + 3] = 255;
  }
}

/*
 * Decodes rows [y0, y0 + h) of the image scaled by scale_num/8 as RGBX (four
 * bytes a pixel, which the resampler and the final write handle faster than
 * three), and at
 * least the columns [x0, x0 + w) (coordinates in scaled pixels). libjpeg
 * widens the columns to whole iMCUs: *out_x0 is the first column written and
 * *out_w the columns per row (the row stride is *out_w * 4). *scaled_w and
 * *scaled_h are the scaled image's size, for the caller to check its own
 * arithmetic. *align is what jpeg_crop_scanline rounds a region's first
 * column down to a multiple of at this scale (the iMCU width), so that the
 * caller can tell where a cropped decode would start without one (the sample
 * cache cuts the same region out of a whole decode). Fails, without writing
 * past out_cap bytes, if the region is outside the scaled image or does not
 * fit.
 */
int loader_jpeg_decode(const unsigned char *data, size_t len,
                       unsigned int scale_num, unsigned int x0,
                       unsigned int y0, unsigned int w, unsigned int h,
                       unsigned char *out, size_t out_cap,
                       unsigned int *out_x0, unsigned int *out_w,
                       unsigned int *scaled_w, unsigned int *scaled_h,
                       unsigned int *align, char *msg, size_t msg_len) {
  struct jpeg_decompress_struct cinfo;
  struct loader_error err;
  /* volatile: read after longjmp. */
  unsigned char *volatile cmyk_row = NULL;
  loader_init(&cinfo, &err, msg, msg_len);
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    free(cmyk_row);
    return LOADER_JPEG_ERROR;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, (unsigned long)len);
  jpeg_read_header(&cinfo, TRUE);
  int cmyk = cinfo.jpeg_color_space == JCS_CMYK ||
             cinfo.jpeg_color_space == JCS_YCCK;
  int inverted = cmyk && cinfo.saw_Adobe_marker;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGBX;
  cinfo.scale_num = scale_num;
  cinfo.scale_denom = 8;
  jpeg_start_decompress(&cinfo);
  *scaled_w = cinfo.output_width;
  *scaled_h = cinfo.output_height;
  /* jpeg_crop_scanline's rule (libjpeg-turbo jdapistd.c). */
#if JPEG_LIB_VERSION >= 70
  unsigned int dct = (unsigned int)cinfo.min_DCT_h_scaled_size;
#else
  unsigned int dct = (unsigned int)cinfo.min_DCT_scaled_size;
#endif
  if (cinfo.comps_in_scan == 1 && cinfo.num_components == 1) {
    *align = dct;
  } else {
    *align = dct * (unsigned int)cinfo.max_h_samp_factor;
  }
  if (w == 0 || h == 0 || x0 > cinfo.output_width ||
      w > cinfo.output_width - x0 || y0 > cinfo.output_height ||
      h > cinfo.output_height - y0) {
    snprintf(msg, msg_len, "region %ux%u at (%u, %u) outside the %ux%u image",
             w, h, x0, y0, cinfo.output_width, cinfo.output_height);
    jpeg_destroy_decompress(&cinfo);
    return LOADER_JPEG_ERROR;
  }
  JDIMENSION xoff = x0, width = w;
  if (w < cinfo.output_width) {
    jpeg_crop_scanline(&cinfo, &xoff, &width);
  }
  if ((size_t)width * 4 * h > out_cap) {
    snprintf(msg, msg_len, "region of %u columns does not fit the buffer",
             (unsigned)width);
    jpeg_destroy_decompress(&cinfo);
    return LOADER_JPEG_ERROR;
  }
  if (cmyk) {
    cmyk_row = malloc((size_t)width * 4);
    if (cmyk_row == NULL) {
      snprintf(msg, msg_len, "out of memory");
      jpeg_destroy_decompress(&cinfo);
      return LOADER_JPEG_ERROR;
    }
  }
  if (y0 > 0) {
    jpeg_skip_scanlines(&cinfo, y0);
  }
  for (unsigned int row = 0; row < h;) {
    unsigned char *dst = out + (size_t)row * width * 4;
    JSAMPROW rows[1] = {cmyk ? cmyk_row : dst};
    JDIMENSION got = jpeg_read_scanlines(&cinfo, rows, 1);
    if (got == 0) {
      snprintf(msg, msg_len, "decoder returned no rows");
      jpeg_destroy_decompress(&cinfo);
      free(cmyk_row);
      return LOADER_JPEG_ERROR;
    }
    if (cmyk) {
      cmyk_to_rgbx(cmyk_row, dst, width, inverted);
    }
    row += got;
  }
  *out_x0 = xoff;
  *out_w = width;
  /* The rows below the region are never decoded. */
  jpeg_abort_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  free(cmyk_row);
  return LOADER_JPEG_OK;
}
