build/channel.o: src/channel.c src/channel.h src/wire.h
src/channel.h:
src/wire.h:
