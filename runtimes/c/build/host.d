build/host.o: src/host.c src/channel.h src/wire.h src/runtime.h \
 include/staccato.h
src/channel.h:
src/wire.h:
src/runtime.h:
include/staccato.h:
