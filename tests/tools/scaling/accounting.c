/* accounting - the core's memory per rank as the core itself computes it,
 * for tests/tools/scaling (scripts/bench-scaling.py --check-formulas
 * compares every line with the formulas of docs/scaling.md):
 *   sizeof <struct> <bytes>            per-rank structures that grow with N
 *   p2p <buffer> <chunk> <npeers> <slot> <nslots> <ring>
 * Links the core's internals (mep_internal_dep), not libmep. */
#include <inttypes.h>
#include <stdio.h>

#include "comm.h"
#include "ft_state.h"
#include "p2p.h"
#include "region.h"

int main(void) {
  printf("sizeof ctl_hdr %zu\n", sizeof(mep__ctl_hdr_t));
  printf("sizeof ft_peer %zu\n", sizeof(mep__ft_peer_t));
  printf("sizeof peer %zu\n", sizeof(mep__peer_t));
  printf("sizeof remote %zu\n", sizeof(mep__remote_t));
  printf("sizeof p2p_pair %zu\n", sizeof(mep__p2p_pair_t));
  static const uint64_t buffers[] = {16777216, 65536, 8192, 1 << 30};
  static const uint64_t chunks[] = {1048576, 4096, 65536};
  static const int peers[] = {1, 2, 3, 7, 15, 63, 255, 1023, 2047, 2048,
                              2049, 4095};
  for (size_t b = 0; b < sizeof buffers / sizeof *buffers; b++)
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++)
      for (size_t p = 0; p < sizeof peers / sizeof *peers; p++) {
        mep__p2p_geom_t g;
        if (mep__p2p_geometry(buffers[b], chunks[c], peers[p], &g)) return 1;
        printf("p2p %" PRIu64 " %" PRIu64 " %d %zu %zu %zu\n", buffers[b],
               chunks[c], peers[p], g.slot, g.nslots, g.ring);
      }
  return 0;
}
