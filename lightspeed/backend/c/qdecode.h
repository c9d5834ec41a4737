/* Decoders of GGUF block formats into float32, written as simple loops gcc vectorises.
 * Layouts are documented in lightspeed/quant/formats.py. Each decodes one block. */

static inline float ls_f16(const uint8_t *p) { _Float16 h; memcpy(&h, p, 2); return (float)h; }

static inline void ls_dq_q8_0(const uint8_t *b, float *restrict w) {
    const float d = ls_f16(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int i = 0; i < 32; i++) w[i] = d * (float)q[i];
}

static inline void ls_dq_q4_0(const uint8_t *b, float *restrict w) {
    const float d = ls_f16(b);
    const uint8_t *qs = b + 2;
    for (int i = 0; i < 16; i++) {
        w[i] = d * (float)((int)(qs[i] & 15) - 8);
        w[i + 16] = d * (float)((int)(qs[i] >> 4) - 8);
    }
}

static inline void ls_dq_q4_1(const uint8_t *b, float *restrict w) {
    const float d = ls_f16(b), m = ls_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int i = 0; i < 16; i++) {
        w[i] = d * (float)(qs[i] & 15) + m;
        w[i + 16] = d * (float)(qs[i] >> 4) + m;
    }
}

static inline void ls_dq_q5_0(const uint8_t *b, float *restrict w) {
    const float d = ls_f16(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const uint8_t *qs = b + 6;
    for (int i = 0; i < 16; i++) {
        int lo = (qs[i] & 15) | (int)(((qh >> i) & 1u) << 4);
        int hi = (qs[i] >> 4) | (int)(((qh >> (i + 16)) & 1u) << 4);
        w[i] = d * (float)(lo - 16);
        w[i + 16] = d * (float)(hi - 16);
    }
}

static inline void ls_dq_q4_k(const uint8_t *b, float *restrict w) {
    const float d = ls_f16(b), dmin = ls_f16(b + 2);
    const uint8_t *sc = b + 4, *qs = b + 16;
    for (int c = 0; c < 4; c++) {
        for (int h = 0; h < 2; h++) {
            int j = 2 * c + h, s, m;
            if (j < 4) {
                s = sc[j] & 63;
                m = sc[j + 4] & 63;
            } else {
                s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
                m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
            }
            const float ds = d * (float)s, dm = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int nib = h ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 15);
                w[64 * c + 32 * h + l] = ds * (float)nib - dm;
            }
        }
    }
}

static inline void ls_dq_q6_k(const uint8_t *b, float *restrict w) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    const float d = ls_f16(b + 208);
    for (int n = 0; n < 2; n++) {
        for (int k = 0; k < 4; k++) {
            for (int l = 0; l < 32; l++) {
                int byte = ql[64 * n + 32 * (k % 2) + l];
                int low = (k / 2) ? (byte >> 4) : (byte & 15);
                int top = (qh[32 * n + l] >> (2 * k)) & 3;
                float s = d * (float)scales[8 * n + 2 * k + l / 16];
                w[128 * n + 32 * k + l] = s * (float)((low | (top << 4)) - 32);
            }
        }
    }
}
