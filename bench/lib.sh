# bench/lib.sh: helpers the bench scripts share, sourced as
#   . "$(dirname "$0")/lib.sh"
# med: the median of the numbers on standard input, one a line (the upper
# of the two middle ones for an even count); cpu_name: the CPU's model name.
med() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
cpu_name() { grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'; }
