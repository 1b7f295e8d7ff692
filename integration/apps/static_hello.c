/* Linked statically: ckpt launch must refuse it (LD_PRELOAD cannot reach it). */
#include <stdio.h>

int main(void)
{
	puts("hello");
	return 0;
}
