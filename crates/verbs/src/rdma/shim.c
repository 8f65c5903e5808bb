/* Hand-written wrappers for the verbs rdma-core defines as macros, which bindgen cannot see
 * as functions. Each is a plain call through the macro, so the header's chosen
 * implementation (e.g. the extended query_port path) is used. */
#include <infiniband/verbs.h>

struct ibv_mr *dmkit_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr(pd, addr, length, access);
}

int dmkit_ibv_query_port(struct ibv_context *context, uint8_t port_num,
			 struct ibv_port_attr *port_attr)
{
	return ibv_query_port(context, port_num, port_attr);
}
