/* mem.c - host or CUDA memory for the suite's regions (mem.h). */
#include "mem.h"

#include <stdlib.h>
#include <string.h>

#include "mem_cuda.h"
#include "pattern.h"

/* CUDA memory moves through the host in chunks of this size. */
#define PC_STAGE (1u << 20)

const char *pc_mem_name(pc_mem_t m) {
  return m == PC_MEM_CUDA ? "CUDA" : "host";
}

mep_memkind_t pc_mem_kind(pc_mem_t m) {
  return m == PC_MEM_CUDA ? MEP_MEM_CUDA : MEP_MEM_HOST;
}

static uint32_t mem_bit(pc_mem_t m) {
  return m == PC_MEM_CUDA ? MEP_TP_MEM_CUDA : MEP_TP_MEM_HOST;
}

pc_mem_t pc_mem_pick(pc_memory_opt_t opt, uint32_t mem_kinds) {
  if (opt == PC_MEMORY_CUDA) return PC_MEM_CUDA;
  if (opt == PC_MEMORY_HOST) return PC_MEM_HOST;
  if (!(mem_kinds & MEP_TP_MEM_HOST) && (mem_kinds & MEP_TP_MEM_CUDA))
    return PC_MEM_CUDA;
  return PC_MEM_HOST;
}

void pc_mem_require(pc_mem_t m, uint32_t mem_kinds) {
  if (!(mem_kinds & mem_bit(m))) {
    if (pc_self()->opts->memory == PC_MEMORY_AUTO)
      pc_skip("the transport handles neither host nor CUDA memory "
              "(mem_kinds 0x%x)",
              mem_kinds);
    pc_skip("the transport does not handle %s memory (mem_kinds 0x%x), "
            "which --memory asks for",
            pc_mem_name(m), mem_kinds);
  }
  char why[256];
  if (m == PC_MEM_CUDA && pc_cuda_open(why, sizeof why) != 0)
    pc_skip("CUDA memory: %s", why);
}

void *pc_mem_alloc(pc_mem_t m, size_t len) {
  if (m == PC_MEM_CUDA) return pc_cuda_alloc(len);
  void *p = NULL;
  if (posix_memalign(&p, 4096, len ? len : 1) != 0)
    pc_fail("out of memory for a region of %zu bytes", len);
  memset(p, 0, len ? len : 1);
  return p;
}

void pc_mem_free(pc_mem_t m, void *p) {
  if (m == PC_MEM_CUDA)
    pc_cuda_free(p);
  else
    free(p);
}

void pc_mem_put(pc_mem_t m, void *dst, const void *src, size_t len) {
  if (m == PC_MEM_CUDA)
    pc_cuda_put(dst, src, len);
  else if (len)
    memcpy(dst, src, len);
}

void pc_mem_get(pc_mem_t m, void *dst, const void *src, size_t len) {
  if (m == PC_MEM_CUDA)
    pc_cuda_get(dst, src, len);
  else if (len)
    memcpy(dst, src, len);
}

static unsigned char *stage_buf(void) {
  static unsigned char *buf;
  if (!buf && !(buf = malloc(PC_STAGE)))
    pc_fail("out of memory for a staging buffer of %u bytes", PC_STAGE);
  return buf;
}

void pc_mem_fill(pc_mem_t m, void *dst, size_t len, uint64_t seed,
                 uint64_t start) {
  if (m == PC_MEM_HOST) {
    pc_fill(dst, len, seed, start);
    return;
  }
  unsigned char *stage = stage_buf();
  for (size_t off = 0; off < len; off += PC_STAGE) {
    size_t n = len - off < PC_STAGE ? len - off : PC_STAGE;
    pc_fill(stage, n, seed, start + off);
    pc_cuda_put((unsigned char *)dst + off, stage, n);
  }
}

void pc_mem_expect(pc_mem_t m, const void *buf, size_t len, uint64_t seed,
                   uint64_t start, const char *what) {
  if (m == PC_MEM_HOST) {
    pc_expect(buf, len, seed, start, what);
    return;
  }
  unsigned char *stage = stage_buf();
  for (size_t off = 0; off < len; off += PC_STAGE) {
    size_t n = len - off < PC_STAGE ? len - off : PC_STAGE;
    pc_cuda_get(stage, (const unsigned char *)buf + off, n);
    pc_expect_part(stage, n, off, len, seed, start + off, what);
  }
}

uint64_t pc_mem_word(pc_mem_t m, const void *p) {
  if (m == PC_MEM_HOST)
    return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
  /* A copy to the host that completes before it returns reads the word as
   * it is in GPU memory; the copies that follow see at least as much. */
  uint64_t v;
  pc_cuda_get(&v, p, sizeof v);
  return v;
}
