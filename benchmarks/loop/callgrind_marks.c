/* Callgrind's client requests, for Python through ctypes (callgrind_marks.py): start counting,
 * zero the counts, and dump them under a name, so that one process can count many workloads
 * without paying for its start-up under instrumentation. Outside valgrind each is a no-op. */
#include <valgrind/callgrind.h>

void marks_start(void) { CALLGRIND_START_INSTRUMENTATION; }

void marks_zero(void) { CALLGRIND_ZERO_STATS; }

void marks_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
