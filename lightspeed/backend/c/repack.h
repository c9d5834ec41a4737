/* The weights' repacked layouts, made when a program is loaded (lightspeed/backend/c/repack.py). */
/* Which formats this build's matmuls read repacked (bit 0 q8_0, 1 q4_0, 2 q4_1, 3 q5_0, 4 q4_k): the executor
 * repacks the weights of those (ls_repack16) and passes the others' as they are; ls_repack_rows: the rows of a
 * group of the layout (16: qdot16x16.h's, AVX-512; 8: repack8.h's, AVX2), so that copies made for one layout
 * are never read by a build of the other. */
const int ls_repack16_formats = 0
#if defined(LS_REPACK16_q8_0)
    | 1
#endif
#if defined(LS_REPACK16_q4_0) || defined(LS_REPACK8_q4_0)
    | 2
#endif
#if defined(LS_REPACK16_q4_1) || defined(LS_REPACK8_q4_1)
    | 4
#endif
#if defined(LS_REPACK16_q5_0)
    | 8
#endif
#if defined(LS_REPACK16_q4_k)
    | 16
#endif
    ;
#if defined(LS_REPACK8)
const int ls_repack_rows = 8;
#else
const int ls_repack_rows = 16;
#endif

/* q5_0's high bits as the repacked layout stores them (one dword per row and block): bit 8t + 4 + j holds the high
 * bit of element 4j + t and bit 8t + j that of element 16 + 4j + t (j, t < 4), so that h >> j (j < 4) and
 * h << (4 - j) put those of the kernel's vectors w[j] and w[4 + j] at bit 4 of their bytes. */
static uint32_t ls_q5_hbits(uint32_t qh) {
    uint32_t h = 0;
    for (int j = 0; j < 4; j++)
        for (int t = 0; t < 4; t++) {
            h |= ((qh >> (4 * j + t)) & 1u) << (8 * t + 4 + j);
            h |= ((qh >> (16 + 4 * j + t)) & 1u) << (8 * t + j);
        }
    return h;
}

/* repack8.h's layout (q4_0, q4_1): per whole group of 8 rows, per block, the 8 float16 scales (q4_1: then the 8
 * minimums), then each row's 16 nibble bytes; rows after the last whole group copied as they are */
static void ls_repack8(const uint8_t *src, uint8_t *dst, int64_t rows, int64_t rb, int qt) {
    const int NS = qt == 2 ? 2 : 1, BB = 2 * NS + 16, BS = 8 * BB;
    const int64_t nblk = rb / BB, whole = rows / 8 * 8;
    for (int64_t g = 0; g < whole; g += 8)
        for (int64_t b = 0; b < nblk; b++)
            for (int n = 0; n < 8; n++) {
                const uint8_t *blk = src + (g + n) * rb + b * BB;
                uint8_t *d = dst + g * rb + b * BS;
                for (int k = 0; k < NS; k++) memcpy(d + 16 * k + 2 * n, blk + 2 * k, 2);
                memcpy(d + 16 * NS + 16 * n, blk + 2 * NS, 16);
            }
    memcpy(dst + whole * rb, src + whole * rb, (size_t)((rows - whole) * rb));
}

/* The repacked layout of a matrix of `rows` rows of rb bytes (nblk = rb / BB blocks; qt: 0 q8_0, 1 q4_0,
 * 2 q4_1, 3 q5_0, 4 q4_k) from src into dst (same size). Per whole group of 16 rows, in its own 16 * rb bytes: the
 * 16 rows' float16 scales of block 0, of block 1, ... (q4_1: then their mins likewise), then per block the quant
 * bytes as ls_w16x16_* gives them from the GGUF layout: dword j of lane n holds bytes 4j..4j+3 of row n's quants
 * (q8_0: 8 dwords a row, each byte plus 128; q4: the 4 dwords of packed nibbles; q5_0: first the high bits as
 * ls_q5_hbits orders them, then the nibbles). q4_k: per super-block, all of its 36 dwords so (dword k of lane n
 * at 64k + 4n: the header's 4, then the nibbles'). Rows after the last whole group are copied as they are.
 * Portable C; but in builds with repack8.h's layout (ls_repack_rows 8: AVX2) q4_0 and q4_1 take that one. */
void ls_repack16(const uint8_t *src, uint8_t *dst, int64_t rows, int64_t rb, int qt) {
    if (ls_repack_rows == 8 && (qt == 1 || qt == 2)) {
        ls_repack8(src, dst, rows, rb, qt);
        return;
    }
    if (qt == 4) {
        const int64_t nsb = rb / 144, whole = rows / 16 * 16;
        for (int64_t g = 0; g < whole; g += 16)
            for (int64_t sb = 0; sb < nsb; sb++) {
                uint8_t *d = dst + g * rb + sb * 16 * 144;
                for (int n = 0; n < 16; n++)
                    for (int k = 0; k < 36; k++)
                        memcpy(d + 64 * k + 4 * n, src + (g + n) * rb + sb * 144 + 4 * k, 4);
            }
        memcpy(dst + whole * rb, src + whole * rb, (size_t)((rows - whole) * rb));
        return;
    }
    const int BB = qt == 0 ? 34 : qt == 1 ? 18 : qt == 2 ? 20 : 22, NS = qt == 2 ? 2 : 1, QBR = BB - 2 * NS;
    const int64_t nblk = rb / BB, whole = rows / 16 * 16;
    for (int64_t g = 0; g < whole; g += 16) {
        const uint8_t *s = src + g * rb;
        uint8_t *d = dst + g * rb, *qd = d + nblk * 32 * NS;
        for (int64_t b = 0; b < nblk; b++)
            for (int n = 0; n < 16; n++) {
                const uint8_t *blk = s + n * rb + b * BB;
                for (int k = 0; k < NS; k++) memcpy(d + (k * nblk + b) * 32 + 2 * n, blk + 2 * k, 2);
                for (int j = 0; j < QBR / 4; j++)
                    for (int t = 0; t < 4; t++)
                        qd[b * 16 * QBR + j * 64 + 4 * n + t] =
                            (uint8_t)(blk[2 * NS + 4 * j + t] ^ (qt == 0 ? 0x80 : 0));
                if (qt == 3) {  /* the first dword of q5_0's quants is qh: stored reordered */
                    uint32_t qh; memcpy(&qh, blk + 2, 4);
                    const uint32_t h = ls_q5_hbits(qh);
                    memcpy(qd + b * 16 * QBR + 4 * n, &h, 4);
                }
            }
    }
    memcpy(dst + whole * rb, src + whole * rb, (size_t)((rows - whole) * rb));
}
