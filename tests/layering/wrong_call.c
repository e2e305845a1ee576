/* tests/layering/wrong_call.c: a runtime/ source that calls the planner
 * (partitioner/), which runtime does not use. It compiles (the public header
 * is on every include path) but the link check of runtime with it,
 * bg_layering_wrong_call, must fail on the undefined bg_part_shortfall:
 * test_layering builds it and expects that. Never part of the build. */
#include <stddef.h>

#include "brigade/partitioner.h"

int bg_layering_wrong_call(void);
int bg_layering_wrong_call(void)
{
    bg_part_shortfall_t sf;
    return (int)bg_part_shortfall(NULL, &sf);
}
