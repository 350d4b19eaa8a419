build/shm.o: src/shm.c src/shm.h
src/shm.h:
