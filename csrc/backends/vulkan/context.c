/*
 * context.c - one context per physical device, shared by every rlx device opened on it (a
 * registry of reference-counted contexts): the instance (with the validation layer and a
 * message-counting messenger when RLX_VULKAN_VALIDATION=1), the logical device with the features
 * the shaders declare, one compute queue, the one descriptor-set layout (push descriptors, six
 * storage buffers) and pipeline layout (128 bytes of push constants) every shader uses, and the
 * pipelines, made on first use with the device's workgroup and subgroup sizes as specialisation
 * constants. A context outlives the rlx devices on it (instance creation and shader compilation
 * are paid once per process, not per device: tests open hundreds); one that no device uses is
 * destroyed at exit (atexit, before the drivers' own destructors run), or when it is reopened
 * after its device was lost. Never prints.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk.h"
#include "core/core.h"

/* the SPIR-V of every shader (tools/build_shaders.py; one table indexed by enum rlx_vk_shader) */
struct rlx_vk_shader_code {
    const char *name;
    const uint32_t *words;
    size_t bytes;
    uint32_t wg;        /* workgroup size (specialisation constant 0), or 0: */
    uint32_t subgroups; /* ... this many times the device's subgroup size */
};
#include "rlx_vk_shaders.inc"

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rlx_vk_context *registry[RLX_VK_MAX_DEVICES];

static const char *result_name(VkResult r)
{
    switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    default: return "a VkResult";
    }
}

rlx_status rlx_vk_check(struct rlx_vk_context *vk, VkResult r, const char *what)
{
    if (r == VK_SUCCESS) return RLX_OK;
    if (r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY)
        return rlx_set_error(RLX_ERR_NOMEM, "vulkan (%s): %s failed: %s", vk->info.name, what, result_name(r));
    if (r == VK_ERROR_DEVICE_LOST) {
        atomic_store(&vk->lost, true);
        return rlx_set_error(RLX_ERR_STATE,
                             "vulkan (%s): the device was lost during %s; this device can run nothing "
                             "more: open another one",
                             vk->info.name, what);
    }
    return rlx_set_error(RLX_ERR_INTERNAL, "vulkan (%s): %s failed: %s (%d)", vk->info.name, what, result_name(r),
                         (int)r);
}

rlx_status rlx_vk_usable(struct rlx_vk_context *vk)
{
    if (atomic_load(&vk->lost))
        return rlx_set_error(RLX_ERR_STATE,
                             "vulkan (%s): the device was lost earlier; this device can run nothing "
                             "more: open another one",
                             vk->info.name);
    return RLX_OK;
}

rlx_status rlx_vk_submit_wait(struct rlx_vk_context *vk, VkCommandBuffer cmd, VkFence fence)
{
    RLX_TRY(rlx_vk_usable(vk));
    const VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cmd};
    pthread_mutex_lock(&vk->queue_lock);
    VkResult r = vk->fn.vkQueueSubmit(vk->queue, 1, &si, fence);
    pthread_mutex_unlock(&vk->queue_lock);
    RLX_TRY(rlx_vk_check(vk, r, "vkQueueSubmit"));
    r = vk->fn.vkWaitForFences(vk->device, 1, &fence, VK_TRUE, UINT64_MAX);
    RLX_TRY(rlx_vk_check(vk, r, "vkWaitForFences"));
    return rlx_vk_check(vk, vk->fn.vkResetFences(vk->device, 1, &fence), "vkResetFences");
}

void rlx_vk_cmd_full_barrier(const struct rlx_vk_context *vk, VkCommandBuffer cmd)
{
    const VkMemoryBarrier mb = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
        .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT,
        .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                         VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT,
    };
    const VkPipelineStageFlags stages =
        VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT;
    vk->fn.vkCmdPipelineBarrier(cmd, stages, stages, 0, 1, &mb, 0, NULL, 0, NULL);
}

/* ---- creation ------------------------------------------------------------------------------- */

static bool env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static rlx_status make_device(struct rlx_vk_context *vk)
{
    uint32_t nq = 0;
    vk->ifn.vkGetPhysicalDeviceQueueFamilyProperties(vk->phys, &nq, NULL);
    VkQueueFamilyProperties qf[16];
    nq = nq > 16 ? 16 : nq;
    vk->ifn.vkGetPhysicalDeviceQueueFamilyProperties(vk->phys, &nq, qf);
    vk->queue_family = UINT32_MAX;
    for (uint32_t i = 0; i < nq && vk->queue_family == UINT32_MAX; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) vk->queue_family = i;
    const float priority = 1.0f;
    const VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                         .queueFamilyIndex = vk->queue_family,
                                         .queueCount = 1,
                                         .pQueuePriorities = &priority};
    /* exactly the features the shaders declare (spirv-dis: StorageBuffer16BitAccess, StorageBuffer8BitAccess) */
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .storageBuffer8BitAccess = VK_TRUE};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &f12,
                                            .storageBuffer16BitAccess = VK_TRUE};
    const char *exts[] = {VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
    const VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                                    .pNext = &f11,
                                    .queueCreateInfoCount = 1,
                                    .pQueueCreateInfos = &qci,
                                    .enabledExtensionCount = 1,
                                    .ppEnabledExtensionNames = exts};
    RLX_TRY(rlx_vk_check(vk, vk->ifn.vkCreateDevice(vk->phys, &dci, NULL, &vk->device), "vkCreateDevice"));
#define LOAD_DEVICE(f) vk->fn.f = (PFN_##f)vk->ifn.vkGetDeviceProcAddr(vk->device, #f);
    RLX_VK_DEVICE_FNS(LOAD_DEVICE)
#undef LOAD_DEVICE
    vk->fn.vkGetDeviceQueue(vk->device, vk->queue_family, 0, &vk->queue);

    VkDescriptorSetLayoutBinding b[RLX_VK_BINDINGS];
    for (uint32_t i = 0; i < RLX_VK_BINDINGS; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = i,
                                              .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1,
                                              .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    const VkDescriptorSetLayoutCreateInfo dl = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                                .flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR,
                                                .bindingCount = RLX_VK_BINDINGS,
                                                .pBindings = b};
    RLX_TRY(rlx_vk_check(vk, vk->fn.vkCreateDescriptorSetLayout(vk->device, &dl, NULL, &vk->dsl),
                         "vkCreateDescriptorSetLayout"));
    const VkPushConstantRange pc = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .size = RLX_VK_PUSH_BYTES};
    const VkPipelineLayoutCreateInfo pl = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                           .setLayoutCount = 1,
                                           .pSetLayouts = &vk->dsl,
                                           .pushConstantRangeCount = 1,
                                           .pPushConstantRanges = &pc};
    RLX_TRY(
        rlx_vk_check(vk, vk->fn.vkCreatePipelineLayout(vk->device, &pl, NULL, &vk->layout), "vkCreatePipelineLayout"));
    const VkCommandPoolCreateInfo cp = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                        .flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT,
                                        .queueFamilyIndex = vk->queue_family};
    RLX_TRY(rlx_vk_check(vk, vk->fn.vkCreateCommandPool(vk->device, &cp, NULL, &vk->xfer_pool), "vkCreateCommandPool"));
    const VkCommandBufferAllocateInfo ca = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                            .commandPool = vk->xfer_pool,
                                            .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                            .commandBufferCount = 1};
    RLX_TRY(
        rlx_vk_check(vk, vk->fn.vkAllocateCommandBuffers(vk->device, &ca, &vk->xfer_cmd), "vkAllocateCommandBuffers"));
    const VkFenceCreateInfo fc = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    return rlx_vk_check(vk, vk->fn.vkCreateFence(vk->device, &fc, NULL, &vk->xfer_fence), "vkCreateFence");
}

static void context_destroy(struct rlx_vk_context *vk)
{
    if (!vk) return;
    if (vk->device) {
        vk->fn.vkDeviceWaitIdle(vk->device);
        rlx_vk_buf_destroy(vk, vk->staging);
        for (int i = 0; i < RLX_VK_SHADER_COUNT; i++)
            if (vk->pipelines[i]) vk->fn.vkDestroyPipeline(vk->device, vk->pipelines[i], NULL);
        if (vk->xfer_fence) vk->fn.vkDestroyFence(vk->device, vk->xfer_fence, NULL);
        if (vk->xfer_pool) vk->fn.vkDestroyCommandPool(vk->device, vk->xfer_pool, NULL);
        if (vk->layout) vk->fn.vkDestroyPipelineLayout(vk->device, vk->layout, NULL);
        if (vk->dsl) vk->fn.vkDestroyDescriptorSetLayout(vk->device, vk->dsl, NULL);
        vk->fn.vkDestroyDevice(vk->device, NULL);
    }
    if (vk->instance) rlx_vk_instance_destroy(vk->instance, &vk->ifn, vk->messenger);
    pthread_mutex_destroy(&vk->lock);
    pthread_mutex_destroy(&vk->queue_lock);
    free(vk);
}

static rlx_status context_create(int index, struct rlx_vk_context **out)
{
    struct rlx_vk_context *vk = rlx_calloc(1, sizeof *vk);
    if (!vk) return RLX_ERR_NOMEM;
    pthread_mutex_init(&vk->lock, NULL);
    pthread_mutex_init(&vk->queue_lock, NULL);
    vk->index = index;
    vk->validation = env_on("RLX_VULKAN_VALIDATION");
    snprintf(vk->info.name, sizeof vk->info.name, "vulkan:%d", index);
    rlx_status s = rlx_vk_instance_create(vk->validation, &vk->instance, &vk->ifn, &vk->messenger);
    if (s != RLX_OK) {
        context_destroy(vk);
        return s;
    }
    uint32_t n = RLX_VK_MAX_DEVICES;
    VkPhysicalDevice pd[RLX_VK_MAX_DEVICES];
    VkResult r = vk->ifn.vkEnumeratePhysicalDevices(vk->instance, &n, pd);
    if ((r != VK_SUCCESS && r != VK_INCOMPLETE) || (uint32_t)index >= n) {
        context_destroy(vk);
        return rlx_set_error(RLX_ERR_INVALID, "vulkan: there is no device %d (%u device%s)", index, n,
                             n == 1 ? "" : "s");
    }
    vk->phys = pd[index];
    rlx_vk_query(&vk->ifn, vk->phys, &vk->info);
    if (!vk->info.usable) {
        s = rlx_set_error(RLX_ERR_UNSUPPORTED, "vulkan: device %d (%s) lacks what rlx needs: %s", index, vk->info.name,
                          vk->info.why_not);
        context_destroy(vk);
        return s;
    }
    s = make_device(vk);
    if (s != RLX_OK) {
        context_destroy(vk);
        return s;
    }
    *out = vk;
    return RLX_OK;
}

/* Destroys the contexts no rlx device uses (at exit: the library is never unloaded before). */
static void destroy_unused(void)
{
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < RLX_VK_MAX_DEVICES; i++)
        if (registry[i] && registry[i]->refs == 0) {
            context_destroy(registry[i]);
            registry[i] = NULL;
        }
    pthread_mutex_unlock(&registry_lock);
}

rlx_status rlx_vk_context_acquire(int index, struct rlx_vk_context **out)
{
    static bool at_exit;
    if (index < 0) {
        const struct rlx_vk_probe *p = rlx_vk_probe();
        if (p->preferred < 0) return rlx_set_error(RLX_ERR_UNSUPPORTED, "%s", p->why_none);
        index = p->preferred;
    }
    if (index >= RLX_VK_MAX_DEVICES)
        return rlx_set_error(RLX_ERR_INVALID, "vulkan: device index %d is out of range", index);
    pthread_mutex_lock(&registry_lock);
    rlx_status s = RLX_OK;
    struct rlx_vk_context *vk = registry[index];
    if (vk && vk->refs == 0 && atomic_load(&vk->lost)) { /* a lost device is replaced once nobody holds it */
        context_destroy(vk);
        vk = registry[index] = NULL;
    }
    if (!vk) s = context_create(index, &registry[index]);
    if (s == RLX_OK) {
        if (!at_exit) at_exit = atexit(destroy_unused) == 0;
        registry[index]->refs++;
        *out = registry[index];
    }
    pthread_mutex_unlock(&registry_lock);
    return s;
}

void rlx_vk_context_release(struct rlx_vk_context *vk)
{
    if (!vk) return;
    pthread_mutex_lock(&registry_lock);
    vk->refs--;
    pthread_mutex_unlock(&registry_lock);
}

/* ---- pipelines ------------------------------------------------------------------------------ */

static rlx_status make_pipeline(struct rlx_vk_context *vk, enum rlx_vk_shader sh, VkPipeline *out)
{
    const struct rlx_vk_shader_code *code = &rlx_vk_shader_code[sh];
    const VkShaderModuleCreateInfo mi = {
        .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = code->bytes, .pCode = code->words};
    VkShaderModule mod;
    RLX_TRY(rlx_vk_check(vk, vk->fn.vkCreateShaderModule(vk->device, &mi, NULL, &mod), "vkCreateShaderModule"));
    /* specialisation: 0 = workgroup size, 1 = the device's subgroup size */
    const uint32_t values[2] = {rlx_vk_shader_wg(vk, sh), vk->info.subgroup_size};
    const VkSpecializationMapEntry map[2] = {{.constantID = 0, .offset = 0, .size = 4},
                                             {.constantID = 1, .offset = 4, .size = 4}};
    const VkSpecializationInfo spec = {
        .mapEntryCount = 2, .pMapEntries = map, .dataSize = sizeof values, .pData = values};
    const VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = mod,
                  .pName = "main",
                  .pSpecializationInfo = &spec},
        .layout = vk->layout,
    };
    VkResult r = vk->fn.vkCreateComputePipelines(vk->device, VK_NULL_HANDLE, 1, &ci, NULL, out);
    vk->fn.vkDestroyShaderModule(vk->device, mod, NULL);
    if (r != VK_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "creating the pipeline of shader %s", code->name);
        return rlx_vk_check(vk, r, what);
    }
    return RLX_OK;
}

uint32_t rlx_vk_shader_wg(const struct rlx_vk_context *vk, enum rlx_vk_shader sh)
{
    const struct rlx_vk_shader_code *c = &rlx_vk_shader_code[sh];
    if (c->wg) return c->wg;
    /* N subgroups, within the device's limits and the 64 subgroups a reduction holds (common.glsl) */
    uint32_t sg = vk->info.subgroup_size, wg = c->subgroups * sg;
    if (wg > 1024) wg = 1024;
    if (wg > vk->info.max_wg_invocations) wg = vk->info.max_wg_invocations;
    return wg < sg ? sg : wg;
}

rlx_status rlx_vk_pipeline(struct rlx_vk_context *vk, enum rlx_vk_shader sh, VkPipeline *out)
{
    pthread_mutex_lock(&vk->lock);
    rlx_status s = RLX_OK;
    if (!vk->pipelines[sh]) s = make_pipeline(vk, sh, &vk->pipelines[sh]);
    if (s == RLX_OK) *out = vk->pipelines[sh];
    pthread_mutex_unlock(&vk->lock);
    return s;
}
