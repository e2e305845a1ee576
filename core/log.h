/* core/log.h: internal logging entry point (the public one is brigade/core.h). */
#ifndef BG_CORE_LOG_H
#define BG_CORE_LOG_H
#include "brigade/core.h"
#endif
