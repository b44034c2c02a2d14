# Resharding checkpoints, across jobs of different world sizes: save at 4 ranks; load at 2, 3,
# 1 and 4, each comparing every parameter's master and moments bitwise with what was saved and
# saving again; then resume at 4 ranks and compare with a 4-rank run that never stopped. Then a
# shorter round with the optimizer states on NVMe, and one at stage 3 (partitioned parameters)
# that ends by loading its checkpoint at stage 2 and the other way round.
# -DSTRATA_RUN=... -DZERO_RANK=... -DWORK=<scratch directory>
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

set(STATES cpu)
set(STAGE 2)
function(job ranks)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ZERO_RANK_STATES=${STATES} ZERO_RANK_STAGE=${STAGE}
                          ${STRATA_RUN} -n ${ranks} --tag-output ${ZERO_RANK} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  message(STATUS "${ranks} rank(s), stage ${STAGE}, ${STATES} states: zero_rank ${ARGN}: exit ${rc}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the ${ranks}-rank job 'zero_rank ${ARGN}' failed (exit ${rc})")
  endif()
endfunction()

job(4 train-save ${WORK}/at4 5)
job(2 load-check-save ${WORK}/at4 ${WORK}/at2)
job(3 load-check-save ${WORK}/at2 ${WORK}/at3)
job(1 load-check-save ${WORK}/at3 ${WORK}/at1)
job(4 load-check-save ${WORK}/at1 ${WORK}/back4)
job(4 train-save ${WORK}/straight 7)
job(4 resume-compare ${WORK}/back4 5 2 ${WORK}/straight)
# The same with the states on NVMe (loading writes them through each chunk's other slot).
set(STATES nvme)
job(4 train-save ${WORK}/nvme4 3)
job(3 load-check-save ${WORK}/nvme4 ${WORK}/nvme3)
job(1 load-check-save ${WORK}/nvme3 ${WORK}/nvme1)
job(2 load-check ${WORK}/nvme1)
# Stage 3: the same checkpoint format; persistent parameters are packed apart, which the
# manifest records, so any stage and world size can read it.
set(STATES cpu)
set(STAGE 3)
job(4 train-save ${WORK}/s3at4 4)
job(3 load-check-save ${WORK}/s3at4 ${WORK}/s3at3)
set(STAGE 2)
job(2 load-check-save ${WORK}/s3at3 ${WORK}/s2at2)
set(STAGE 3)
job(1 load-check ${WORK}/s2at2)
file(REMOVE_RECURSE ${WORK})
