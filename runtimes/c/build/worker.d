build/worker.o: src/worker.c src/channel.h src/wire.h src/runtime.h \
 include/staccato.h src/shm.h
src/channel.h:
src/wire.h:
src/runtime.h:
include/staccato.h:
src/shm.h:
