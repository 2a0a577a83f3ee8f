/* mem.h - the memory the suite registers: host memory, or CUDA memory of
 * the current GPU for plugins that carry only that (nvlink). Every byte
 * the checks put into a region or read out of one goes through here, so
 * that each check runs unchanged on either. CUDA memory is reached with
 * copies to and from the host, each complete when its function returns:
 * slow, and exactly what a conformance check needs. Failures of the memory
 * itself end the check (pc_fail) naming the call and its error. */
#ifndef PC_MEM_H
#define PC_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "worker.h"

typedef enum pc_mem { PC_MEM_HOST, PC_MEM_CUDA } pc_mem_t;

/* "host" or "CUDA", for messages. */
const char *pc_mem_name(pc_mem_t m);
/* What reg() is told: MEP_MEM_HOST or MEP_MEM_CUDA. */
mep_memkind_t pc_mem_kind(pc_mem_t m);

/* The memory for a plugin that carries `mem_kinds` (props), as --memory
 * asks: auto takes host memory where the plugin carries it, else CUDA
 * memory where it carries that. */
pc_mem_t pc_mem_pick(pc_memory_opt_t opt, uint32_t mem_kinds);

/* SKIPs the check unless `m` can be used: the plugin carries it, and for
 * CUDA memory this program was built with CUDA and a GPU is there. */
void pc_mem_require(pc_mem_t m, uint32_t mem_kinds);

/* Exactly len bytes (so that ASan catches a plugin touching more of host
 * memory), zeroed; at least 1 byte is allocated. */
void *pc_mem_alloc(pc_mem_t m, size_t len);
void pc_mem_free(pc_mem_t m, void *p);

/* Host bytes into memory `m`, and back. */
void pc_mem_put(pc_mem_t m, void *dst, const void *src, size_t len);
void pc_mem_get(pc_mem_t m, void *dst, const void *src, size_t len);

/* pc_fill and pc_expect (pattern.h) on memory `m`. */
void pc_mem_fill(pc_mem_t m, void *dst, size_t len, uint64_t seed,
                 uint64_t start);
void pc_mem_expect(pc_mem_t m, const void *buf, size_t len, uint64_t seed,
                   uint64_t start, const char *what);

/* The 8-byte word at p, read with acquire ordering: whatever the peer
 * wrote before it stored the word is visible after this returns. */
uint64_t pc_mem_word(pc_mem_t m, const void *p);

#endif
