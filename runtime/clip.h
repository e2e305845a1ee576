/* runtime/clip.h: gradient clipping by global norm: an exact sum of squares
 * (limbs whose sum over ranks is exact in fp64, so the norm has the same bits
 * whatever the layout and the order in which ranks meet) and the factor
 * min(1, clip / (norm + eps)). It must not know ranks or strategies: the
 * executor (exec_clip.c) and the parameter servers (ps.c) reduce the limbs. */
#ifndef BG_RUNTIME_CLIP_H
#define BG_RUNTIME_CLIP_H

/* Limbs of 20 bits covering every double from the smallest subnormal up:
 * each holds an integer < 2^20 per value added, so up to 2^33 values (over
 * all ranks) sum exactly as doubles, in any order. */
enum { BG__CLIP_LIMBS = 106 };
#define BG__CLIP_EPS 1e-6

/* Add v (>= 0, finite; NaN or infinity make the sum infinite) exactly. */
void bg__clip_add(double *limbs, double v);
/* The sum the limbs hold (the same bits for the same exact sum). */
double bg__clip_value(const double *limbs);
/* The factor the gradients are multiplied by: 1 when no clipping is needed
 * (clip <= 0, or norm + eps <= clip), else clip / (norm + eps) as a float. */
float bg__clip_factor(double clip, double norm);

#endif
