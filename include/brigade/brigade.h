/**
 * @file brigade.h
 * @brief Umbrella header of libbrigade.
 *
 * @code
 *   #include <brigade/brigade.h>
 *
 *   bg_backend_t *be;
 *   bg_model_t *model;
 *   bg_model_config_t cfg = BG_MODEL_CONFIG_INIT;   // GPT defaults
 *   if (bg_backend_create("cpu", NULL, &be) != BG_OK ||
 *       bg_model_create(&cfg, be, &model) != BG_OK) {
 *       fprintf(stderr, "%s\n", bg_last_error());
 *       return 1;
 *   }
 *   // ... bg_trainer_* to train; see docs/
 * @endcode
 */
#ifndef BRIGADE_BRIGADE_H
#define BRIGADE_BRIGADE_H

#include "brigade/status.h"
#include "brigade/core.h"
#include "brigade/backend.h"
#include "brigade/layer.h"
#include "brigade/model.h"
#include "brigade/train.h"
#include "brigade/schedule.h"
#include "brigade/transport.h"
#include "brigade/checkpoint.h"
#include "brigade/executor.h"
#include "brigade/partitioner.h"

#endif
